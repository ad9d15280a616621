"""A stand-in for `optimum-cli export openvino ... OUT`: writes a fake IR into OUT.

The fake IR names its --weight-format (the fake pipeline's outputs depend on it), and an
int8 / int4 export records its quantization in openvino_config.json as optimum does.
Each call appends its arguments to $FAKE_OPENVINO_EXPORT_LOG (when set), so tests can
check that the export runs once and is reused; $FAKE_OPENVINO_FAIL_EXPORT makes it fail.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    args = sys.argv[1:]
    if args[:2] != ["export", "openvino"] or "--weight-format" not in args:
        print(f"fake optimum-cli: unexpected arguments {args}", file=sys.stderr)
        return 2
    log = os.environ.get("FAKE_OPENVINO_EXPORT_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(" ".join(args) + "\n")
    if os.environ.get("FAKE_OPENVINO_FAIL_EXPORT"):
        print("fake optimum-cli: export failed", file=sys.stderr)
        return 1
    out = Path(args[-1])
    out.mkdir(parents=True, exist_ok=True)
    weights = _option(args, "--weight-format")
    (out / "openvino_model.xml").write_text(f"<net name='fake' weights='{weights}'/>\n",
                                            encoding="utf-8")
    if weights in ("int8", "int4"):  # optimum's defaults: asymmetric, int8 per channel
        group = -1 if weights == "int8" else int(_option(args, "--group-size") or 128)
        quant = {"bits": int(weights[3:]), "sym": False, "group_size": group, "ratio": 1.0}
        (out / "openvino_config.json").write_text(json.dumps({"quantization_config": quant}),
                                                  encoding="utf-8")
    return 0


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


if __name__ == "__main__":
    sys.exit(main())
