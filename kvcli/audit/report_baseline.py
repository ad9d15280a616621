"""--write-baseline / --baseline: set up the observer, write the file, report what moved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvcli.audit.baseline import Baseline, BaselineObserver
from kvcli.audit.profiles import Profile
from kvcli.audit.report_json import excerpt_dict
from kvcli.audit.report_text import excerpt_lines
from kvcli.audit.sources import InputError
from kvcli.audit.style import Style
from kvcli.audit.tokenizers import AuditTokenizer


def make_observer(write: str | None, check: str | None, tokenizer: AuditTokenizer, profile: Profile) -> BaselineObserver | None:
    if write and check:
        raise InputError("--write-baseline and --baseline: give one (write it once, then check against it)")
    if not (write or check):
        return None
    expected = None
    if check:
        try:
            expected = Baseline.load(Path(check))
            expected.check_compatible(tokenizer.name, profile.block_size, profile.name)
        except OSError as err:
            raise InputError(f"--baseline {check}: {err.strerror or err}") from err
        except (ValueError, KeyError, TypeError) as err:
            raise InputError(str(err) if isinstance(err, ValueError) else f"--baseline {check}: malformed") from err
    return BaselineObserver(tokenizer, Baseline(tokenizer.name, profile.block_size, profile.name), expected)


def write_baseline(observer: BaselineObserver, path: str) -> str:
    observer.baseline.write(Path(path))
    b = observer.baseline
    return f"wrote {path}: {len(b.prompts):,} prompt(s), {len(b.prefixes):,} distinct stable prefix(es)"


def baseline_lines(observer: BaselineObserver, block_size: int, style: Style) -> list[str]:
    moved = observer.moved
    head = f"  {observer.checked:,} prompt(s) checked, {len(moved):,} moved, {observer.unknown:,} not in the baseline"
    lines = ["", style("── baseline ", "bold") + "─" * 60, head]
    for m in moved:
        lines.append(f"  {style('moved', 'error')}   {m.message(block_size)}")
        lines.extend(excerpt_lines(m.excerpt, "now", style, other="baseline"))
    return lines


def baseline_dict(observer: BaselineObserver, block_size: int) -> dict[str, Any]:
    return {
        "checked": observer.checked, "unknown": observer.unknown,
        "moved": [{"prompt": m.prompt, "key": m.key, "block": m.block, "char": m.char, "segment": m.segment,
                   "baseline_blocks": m.was_blocks, "blocks": m.now_blocks, "why": m.explained_by,
                   "message": m.message(block_size), "excerpt": excerpt_dict(m.excerpt)} for m in observer.moved],
    }  # fmt: skip
