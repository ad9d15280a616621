#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-perplexity (CPU, native ISA flags) from the
# llama.cpp vendored in the llama-cpp-python sdist, so `kvcli bench --compare llamacpp`
# can be reproduced without a GitHub checkout. Usage:
#   scripts/build_llama_server.sh [WORKDIR] [JOBS]
# WORKDIR defaults to ./llama-build; binaries land in WORKDIR/build/bin/.
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

cmake -S "$src/vendor/llama.cpp" -B build -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build build --target llama-server llama-perplexity -j "$jobs"
echo "built: $(pwd)/build/bin/llama-server $(pwd)/build/bin/llama-perplexity"
