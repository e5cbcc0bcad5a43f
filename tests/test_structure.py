"""Structure: no import circle among stepcli's modules, counting imports made only for type checking too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "stepcli"


def _imports(path: Path) -> set[str]:
    """Modules of the package that `path` imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists() else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("stepcli") and name != module}


def test_no_import_cycles() -> None:
    graph = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): _imports(p)
        for p in PACKAGE.rglob("*.py")
        if "_bootstrap" not in p.parts
    }
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycles.append(trail[trail.index(node) :] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, trail + [node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    assert not cycles, cycles[0]
