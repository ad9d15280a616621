#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-perplexity (CPU, native ISA flags) from the
# llama.cpp vendored in the llama-cpp-python sdist, so `kvcli bench --compare llamacpp`
# can be reproduced without a GitHub checkout. Usage:
#   scripts/build_llama_server.sh [WORKDIR] [JOBS]
# WORKDIR defaults to ./llama-build; binaries land in WORKDIR/build/bin/.
# LLAMA_NO_AMX=1: the native flags minus AMX. Some VMs list amx_tile/amx_int8 in /proc/cpuinfo
# yet fault on the first tile instruction (llama-server dies with "Illegal instruction" while
# warming up a Q4_1/Q8_0 model); -march=native cannot be narrowed, so the ISA is spelled out.
set -euo pipefail

workdir="${1:-llama-build}"
jobs="${2:-$(nproc)}"
mkdir -p "$workdir"
cd "$workdir"

if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    echo "cmake and g++ are needed (e.g. apt-get install -y cmake g++)" >&2
    exit 1
fi

if ! ls llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    python -m pip download --no-deps --no-binary :all: llama-cpp-python -d .
fi
sdist="$(ls llama_cpp_python-*.tar.gz | sort -V | tail -n 1)"
src="${sdist%.tar.gz}"
[ -d "$src" ] || tar xzf "$sdist"

isa=(-DGGML_NATIVE=ON)
if [ "${LLAMA_NO_AMX:-0}" = 1 ]; then
    flags="$(grep -m1 '^flags' /proc/cpuinfo)"
    has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
         -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)"
         -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
         -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)"
         -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
cmake -S "$src/vendor/llama.cpp" -B build -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build build --target llama-server llama-perplexity -j "$jobs"
echo "built: $(pwd)/build/bin/llama-server $(pwd)/build/bin/llama-perplexity"
