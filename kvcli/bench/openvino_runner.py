"""Run OpenVINO GenAI's continuous batching for `kvcli bench --compare openvino`, in its Python.

`--compare openvino-default` runs the same with no precision property forced (OpenVINO's
CPU defaults: bf16 inference where the CPU has it, a u8 KV cache) and reports what they are;
openvino-int8 / openvino-int4 do so on an int8 / int4 weight export (args "weight_format",
"export_options"), whose weight compression the runner reads back from the IR.

Executed by the interpreter given by --openvino-python, so it imports only the standard
library, openvino and openvino_genai (and peer_serve.py, which is standard library), never
kvcli. Protocol, one JSON object per line (peer_serve.py runs the loop): the runner exports
the model to OpenVINO IR once if `ir_dir` has none (optimum-cli at "weight_format"; cached
there for later starts), builds the pipeline, and writes {"ready": true, "load_s": ...,
"export_s": ..., "precision": {...}, "weights": {...}}. Then it answers two kinds of lines:
  {"reset": {"num_kv_blocks": n, "warm_token": t}}  a fresh pipeline (OpenVINO has no
      prefix-cache reset) with an n-block KV cache, warmed by one request [t]; untimed.
  {"prompts": [[ids]], "max_new_tokens": n}  one timed batch: outputs, first-token times,
      the number of step() calls, peak RSS.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peer_serve import peak_rss_mb, reset_peak, serve

IR_MODEL = "openvino_model.xml"
WEIGHT_KEYS = ("mode", "group_size", "ratio", "backup_mode")  # of NNCF's weight_compression
# float32 everywhere: the CPU plugin would keep the KV cache in u8 and may run bf16/f16
# kernels; kvcli, vLLM and transformers all run fp32, so greedy outputs must agree.
F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
       "KEY_CACHE_PRECISION": "f32", "VALUE_CACHE_PRECISION": "f32",
       "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
LOAD_BLOCKS = 64  # the KV cache of the pipeline built at load, before any workload is known
# What `--compare openvino-default` (args "precision": "default") reports it ran at: the CPU
# plugin's own values, read back since nothing is forced there.
REPORTED = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE")


def export_ir(model_dir: str, ir_dir: Path, weight_format: str, options: list[str]) -> float:
    """The IR of `model_dir` in `ir_dir` (written once, then reused); seconds spent exporting."""
    if (ir_dir / IR_MODEL).is_file():
        return 0.0
    start = time.perf_counter()
    temp = ir_dir.with_name(f".{ir_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(temp, ignore_errors=True)
    command = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino",
               "--model", model_dir, "--task", "text-generation-with-past",
               "--weight-format", weight_format, *options, str(temp)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a local directory: never the network
    done = subprocess.run(command, env=env, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if done.returncode != 0 or not (temp / IR_MODEL).is_file():
        shutil.rmtree(temp, ignore_errors=True)
        raise RuntimeError(f"optimum-cli export openvino of {model_dir} failed (exit "
                           f"{done.returncode}); is optimum-intel[openvino] installed?")
    os.replace(temp, ir_dir)  # readers see no IR or a whole one
    return time.perf_counter() - start


def weights_of(ir_dir: Path) -> dict[str, str]:
    """The IR's weight compression as NNCF recorded it in the model's rt_info (mode, group
    size, ratio, backup mode; {} for float weights): what ran, even for an IR directory
    exported by hand or by an older kvcli. optimum's openvino_config.json does not say."""
    import xml.etree.ElementTree as ET

    node = ET.parse(ir_dir / IR_MODEL).getroot().find("rt_info/nncf/weight_compression")
    if node is None:
        return {}
    return {child.tag: str(child.get("value")) for child in node if child.tag in WEIGHT_KEYS}


class Peer:
    """The pipeline and the settings it is rebuilt with."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.ir_dir = str(args["ir_dir"])
        self.max_num_batched_tokens = int(args["max_num_batched_tokens"])
        forced = F32 if args.get("precision", "f32") == "f32" else {}  # default: as it ships
        self.properties = {**forced, "INFERENCE_NUM_THREADS": int(args["threads"])}
        self.pipe: Any = None

    def build(self, num_kv_blocks: int, warm_token: int) -> None:
        """A fresh pipeline, its first (slow) inference spent on one request of one token."""
        import openvino_genai as ov_genai

        self.pipe = None
        gc.collect()  # free the old KV cache before the new one is allocated
        config = ov_genai.SchedulerConfig()
        config.enable_prefix_caching = True
        config.max_num_batched_tokens = self.max_num_batched_tokens
        config.num_kv_blocks = num_kv_blocks
        config.dynamic_split_fuse = True  # chunked prefill within the token budget, as kvcli
        self.pipe = ov_genai.ContinuousBatchingPipeline(self.ir_dir, config, "CPU",
                                                        self.properties)
        self.generate([[warm_token]], 1)

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
        """All requests added at once, then step() until done; greedy, EOS ignored."""
        import openvino as ov
        import openvino_genai as ov_genai

        params = ov_genai.GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True)
        start = time.perf_counter()
        handles = [self.pipe.add_request(i, ov.Tensor(_int64_row(ids)), params)
                   for i, ids in enumerate(prompts)]
        tokens: list[list[int]] = [[] for _ in prompts]
        first: dict[int, float] = {}
        steps = 0
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            steps += 1
            for i, handle in enumerate(handles):
                if handle.can_read():  # read() hands over the tokens new since the last read
                    for out in handle.read().values():
                        tokens[i].extend(int(t) for t in out.generated_ids)
                    if tokens[i] and i not in first:
                        first[i] = time.perf_counter() - start
        wall = time.perf_counter() - start
        return {"wall_s": wall, "outputs": tokens, "steps": steps,
                "ttfts": [first[i] for i in range(len(prompts)) if i in first]}


def _int64_row(ids: list[int]) -> Any:
    import numpy as np  # a dependency of openvino

    return np.array([ids], dtype=np.int64)


def load(args: dict[str, Any]) -> tuple[Peer, dict[str, Any]]:
    import openvino_genai as ov_genai  # first: its absence is the error to report

    ir_dir = Path(args["ir_dir"])
    export_s = export_ir(str(args["model"]), ir_dir, str(args.get("weight_format", "fp32")),
                         [str(o) for o in args.get("export_options", [])])
    peer = Peer(args)
    peer.build(LOAD_BLOCKS, 0)
    version = str(getattr(ov_genai, "__version__", "unknown"))
    return peer, {"version": version, "export_s": round(export_s, 2),
                  "precision": precision_of(peer.properties), "weights": weights_of(ir_dir)}


def precision_of(properties: dict[str, Any]) -> dict[str, str]:
    """The precision properties the pipeline runs with: those forced, else the plugin's."""
    import openvino as ov

    core = ov.Core()
    return {key: _text(properties[key] if key in properties else core.get_property("CPU", key))
            for key in REPORTED}


def _text(value: Any) -> str:
    """A property's value as OpenVINO spells it: an element type's short name (bf16, u8),
    not the str() of its openvino.Type ("<Type: 'bfloat16'>")."""
    name = getattr(value, "get_type_name", None)
    return str(name() if callable(name) else value)


def handle(peer: Peer, request: dict[str, Any]) -> dict[str, Any]:
    if "reset" in request:
        start = time.perf_counter()
        peer.build(int(request["reset"]["num_kv_blocks"]), int(request["reset"]["warm_token"]))
        return {"reset_s": round(time.perf_counter() - start, 3)}
    measured = reset_peak()
    reply = peer.generate(request["prompts"], request["max_new_tokens"])
    metrics = peer.pipe.get_metrics()
    return {**reply, "peak_rss_mb": peak_rss_mb(measured),
            "kv_cache_bytes": int(metrics.kv_cache_size_in_bytes),
            "max_cache_usage": float(metrics.max_cache_usage)}


if __name__ == "__main__":
    sys.exit(serve(load, handle))
