"""A stand-in for `optimum-cli export openvino ... OUT`: writes a fake IR into OUT.

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
    (out / "openvino_model.xml").write_text("<net name='fake'/>\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
