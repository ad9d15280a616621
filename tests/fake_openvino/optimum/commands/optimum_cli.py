"""A stand-in for `optimum-cli export openvino ... OUT`: writes a fake IR into OUT.

The fake IR names its --weight-format (the fake pipeline's outputs depend on it), and an
int8 / int4 export records its compression in the IR's rt_info as NNCF does.
Each call appends its arguments to $FAKE_OPENVINO_EXPORT_LOG (when set), so tests can
check that the export runs once and is reused; $FAKE_OPENVINO_FAIL_EXPORT makes it fail.
"""

from __future__ import annotations

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
    (out / "openvino_model.xml").write_text(
        f"<net name='fake' weights='{weights}'>{_rt_info(weights, args)}</net>\n",
        encoding="utf-8")
    return 0


def _rt_info(weights: str | None, args: list[str]) -> str:
    """NNCF's record of an int8 / int4 compression (optimum's defaults: asymmetric, int8 per
    channel, int4's embeddings and head kept int8), none for float weights."""
    if weights not in ("int8", "int4"):
        return ""
    group = "-1" if weights == "int8" else _option(args, "--group-size") or "128"
    fields = {"mode": f"{weights}_asym", "group_size": group, "ratio": "1.0",
              "backup_mode": "int8_asym", "awq": "False"}
    items = "".join(f"<{key} value='{value}'/>" for key, value in fields.items())
    return f"<rt_info><nncf><weight_compression>{items}</weight_compression></nncf></rt_info>"


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


if __name__ == "__main__":
    sys.exit(main())
