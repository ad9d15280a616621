"""OpenVINO GenAI's continuous batching as a benchmark peer, in its own Python.

`--openvino-python PATH` names a venv with openvino-genai and optimum-intel (which pins
its own torch). The peer starts `openvino_runner.py` there once; on first use the runner
exports kvcli's model directory to OpenVINO IR (about a minute) into the variant's
directory beside it (<model dir>/openvino-fp32/, openvino-int8/, openvino-int4/), reused by
later starts. Export and compile are load time, never timed. OpenVINO has no prefix-cache
reset, so before every timed run the runner builds a fresh pipeline (untimed,
`before_run`) with a KV cache sized by the rule every paged system follows
(systems.pages_needed, its CPU block size of 32), warmed by a one-token request that shares
no prefix with the run's prompts.

The variants (VARIANTS): `openvino` forces float32 everywhere on the fp32 IR, so its greedy
outputs must equal kvcli's; `openvino-default`, `openvino-int8` and `openvino-int4` run
OpenVINO's CPU defaults on the fp32, int8 and int4 weight exports, and their greedy
agreement with kvcli is measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvcli.bench.peer_process import PeerProcess, PeerUnavailable, peer_env
from kvcli.bench.systems import RunResult, pages_needed

OPENVINO = "openvino"
RUNNER = Path(__file__).with_name("openvino_runner.py")
BLOCK_SIZE = 32  # the CPU plugin's KV block size
INSTALL_HINT = (
    "install OpenVINO GenAI and optimum-intel into their own venv and pass its python, e.g.\n"
    "  python -m venv ~/openvino-venv\n"
    "  ~/openvino-venv/bin/pip install openvino-genai==2026.4.1.0\n"
    "  ~/openvino-venv/bin/pip install torch==2.13.0 'optimum-intel[openvino]'\n"
    "  ~/openvino-venv/bin/pip uninstall -y torchvision\n"
    "  kvcli bench --compare openvino --openvino-python ~/openvino-venv/bin/python ...\n"
    "(torchvision breaks the export: operator torchvision::nms does not exist)")


class OpenVinoUnavailable(PeerUnavailable):
    """The OpenVINO peer cannot start: no interpreter, no openvino_genai, or a failed export."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One `--compare openvino*` row: the IR it runs and whether float32 is forced on it."""

    weight_format: str  # optimum-cli's --weight-format; also names the IR's directory
    weights: str  # the report's weights cell
    forced_f32: bool = False  # else OpenVINO's CPU defaults, read back by the runner
    export_options: tuple[str, ...] = ()  # more optimum-cli options for this IR

    @property
    def ir_dir_name(self) -> str:
        return f"openvino-{self.weight_format}"


VARIANTS = {
    OPENVINO: Variant("fp32", "float32", forced_f32=True),
    "openvino-default": Variant("fp32", "defaults"),
    "openvino-int8": Variant("int8", "int8"),  # per output channel
    # groups of 64: the hidden size of the default model (576) is no multiple of the default 128
    "openvino-int4": Variant("int4", "int4", export_options=("--group-size", "64")),
}
IR_DIR_NAME = VARIANTS[OPENVINO].ir_dir_name  # the fp32 IR, shared by openvino and -default


def first_unused_token(prompts: list[list[int]]) -> int:
    """A token id no prompt starts with: a warm-up prompt of it can never be a cached prefix."""
    starts = {p[0] for p in prompts if p}
    return next(t for t in range(len(starts) + 1) if t not in starts)


def weights_text(compression: dict) -> str:
    """The IR's weights from NNCF's record (the runner's weights_of): fp32 without one, else
    e.g. "int4 asym group 64, int8 asym backup" (group -1: a scale per output channel; the
    backup mode is that of the layers kept out of int4, the embeddings and head)."""
    if not compression:
        return "fp32"
    mode = compression.get("mode", "?")
    group = compression.get("group_size", "-1")
    text = mode.replace("_", " ") + (" per channel" if group == "-1" else f" group {group}")
    if float(compression.get("ratio", "1")) != 1.0:
        text += f", {float(compression['ratio']):.0%} of layers"
    backup = compression.get("backup_mode", mode)
    return text + ("" if backup == mode else f", {backup.replace('_', ' ')} backup")


@dataclass(slots=True)
class OpenVinoSystem:
    """A running openvino_runner.py: one export/compile, then a fresh pipeline per timed run."""

    python: Path
    model_dir: Path
    max_num_batched_tokens: int
    threads: int
    name: str = OPENVINO
    load_s: float = 0.0
    export_s: float = 0.0
    version: str = ""
    reset_s: float = 0.0  # the last before_run's pipeline rebuild, untimed
    properties: dict = field(default_factory=dict)  # the precision it reported running at
    compression: dict = field(default_factory=dict)  # the IR's compression (NNCF's)
    _peer: PeerProcess | None = field(default=None, init=False)

    @property
    def variant(self) -> Variant:
        return VARIANTS[self.name]

    @property
    def ir_dir(self) -> Path:
        return Path(self.model_dir) / self.variant.ir_dir_name

    @property
    def needs_export(self) -> bool:
        return not (self.ir_dir / "openvino_model.xml").is_file()  # the runner's IR_MODEL

    def start(self) -> OpenVinoSystem:
        self._peer = PeerProcess(OPENVINO, Path(self.python), RUNNER, "--openvino-python",
                                 "openvino_genai", INSTALL_HINT, OpenVinoUnavailable)
        variant = self.variant
        args = {"model": str(self.model_dir), "ir_dir": str(self.ir_dir),
                "weight_format": variant.weight_format,
                "export_options": list(variant.export_options),
                "max_num_batched_tokens": self.max_num_batched_tokens, "threads": self.threads,
                "precision": "f32" if variant.forced_f32 else "default"}
        ready = self._peer.start(args, peer_env({}))
        self.properties = dict(ready.get("precision") or {})
        self.compression = dict(ready.get("weights") or {})
        self.load_s, self.version = float(ready["load_s"]), str(ready.get("version", ""))
        self.export_s = float(ready.get("export_s", 0.0))
        return self

    @property
    def exact(self) -> bool:
        """float32 forced: greedy outputs are float32's; at its defaults they are measured."""
        return self.variant.forced_f32

    @property
    def precision(self) -> str:
        """The report row's precision, from what the runner read back (IR and plugin)."""
        props = self.properties
        text = (f"{weights_text(self.compression)} weights, inference "
                f"{props.get('INFERENCE_PRECISION_HINT', '?')}, KV "
                f"{props.get('KV_CACHE_PRECISION', '?')}")
        return text + (" (forced)" if self.variant.forced_f32 else " (its defaults)")

    @property
    def weights_kind(self) -> str:
        return self.variant.weights

    def _request(self, message: dict) -> dict:
        if self._peer is None:
            raise OpenVinoUnavailable("openvino peer: not started")
        return self._peer.request(message)

    def before_run(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Untimed: a pipeline with an empty prefix cache and a KV cache sized to the run."""
        blocks = pages_needed(prompts, max_new_tokens, BLOCK_SIZE)
        reply = self._request({"reset": {"num_kv_blocks": blocks,
                                         "warm_token": first_unused_token(prompts)}})
        self.reset_s = float(reply["reset_s"])

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        reply = self._request({"prompts": prompts, "max_new_tokens": max_new_tokens})
        # OpenVINO counts no cached tokens, so the prefill it computed is unknown (None).
        return RunResult(outputs=reply["outputs"], prefill_tokens_computed=None,
                         ttfts=reply["ttfts"], peak_rss_mb=reply.get("peak_rss_mb"),
                         details={"engine_wall_s": round(reply["wall_s"], 5),
                                  "steps": reply["steps"], "load_s": self.load_s,
                                  "export_s": self.export_s, "reset_s": self.reset_s,
                                  "ir_dir": str(self.ir_dir),
                                  "version": self.version, "block_size": BLOCK_SIZE,
                                  "kv_cache_bytes": reply.get("kv_cache_bytes"),
                                  "max_cache_usage": reply.get("max_cache_usage")})

    def close(self) -> None:
        if self._peer is not None:
            self._peer.close()
