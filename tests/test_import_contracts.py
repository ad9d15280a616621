"""The layer map is enforced: import-linter's contracts (pyproject.toml), no import cycle at any
level (grimp, imports inside functions counted, TYPE_CHECKING ones not), and the torch-free
commands stay torch-free."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("kvcli", exclude_type_checking_imports=True, cache_dir=None)


def _cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    adj: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if a != b:
            adj[a].add(b)
            adj.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(sorted(adj[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(adj[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _edges(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    return [(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)]


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_module_import_cycle() -> None:
    assert _cycles(_edges(_graph())) == []


def test_no_package_cycle_at_any_level() -> None:
    """Within every package, its children (modules and subpackages, each with everything under
    it) import each other without a cycle: kvcli's subpackages, model/'s, and so on down."""
    graph = _graph()
    edges = _edges(graph)
    packages = [m for m in graph.modules if graph.find_children(m)]
    found = {}
    for package in packages:
        prefix = package + "."

        def child(module: str, prefix: str = prefix) -> str | None:
            if not module.startswith(prefix):
                return None
            return prefix + module[len(prefix):].split(".")[0]

        squashed = [(ca, cb) for a, b in edges
                    if (ca := child(a)) and (cb := child(b)) and ca != cb]
        if cycles := _cycles(squashed):
            found[package] = cycles
    assert found == {}


def test_the_cycle_finder_finds_a_lazy_cycle() -> None:
    assert _cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert _cycles([("a", "b"), ("b", "c")]) == []


def test_help_and_audit_never_import_torch_or_the_model(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello there"}\n{"prompt": "hello again"}\n')
    code = ("import sys\nfrom click.testing import CliRunner\nfrom kvcli.cli import main\n"
            "for args in (['--help'], ['audit', '--help'], ['models', '--help']):\n"
            "    assert CliRunner().invoke(main, args).exit_code == 0, args\n"
            f"assert CliRunner().invoke(main, ['audit', {str(prompts)!r}]).exit_code in (0, 1)\n"
            "heavy = {m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')\n"
            "         or m.startswith(('kvcli.model', 'kvcli.engine.llm', 'kvcli.engine.model_runner'))}\n"
            "assert not heavy, sorted(heavy)[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
