"""Byte sizes on the command line: ``2GiB``, ``512MiB``, ``1.5GB``, ``2G``, ``1000000``.

``KiB/MiB/GiB/TiB`` and the bare ``K/M/G/T`` are powers of 1024; ``KB/MB/GB/TB``
are powers of 1000; a plain number is bytes. Case-insensitive; spaces allowed.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _UNITS[_p] = _UNITS[f"{_p}ib"] = 1024**_i
    _UNITS[f"{_p}b"] = 1000**_i

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text``; raises ValueError with the accepted forms."""
    m = _SIZE.match(text.lower())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"expected a size like 2GiB, 512MiB, 1.5GB or a number of bytes, "
                         f"got {text!r}")
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value <= 0:
        raise ValueError(f"expected a size above zero, got {text!r}")
    return value
