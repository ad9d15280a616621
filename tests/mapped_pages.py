"""How much of a file this process holds in memory through its mappings (Linux)."""

from __future__ import annotations

from pathlib import Path

SMAPS = Path("/proc/self/smaps")


def resident_kb(path: Path) -> int:
    """This process's resident kB of the file at ``path`` (its mappings in /proc/self/smaps)."""
    total, inside = 0, False
    for line in SMAPS.read_text().splitlines():
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total
