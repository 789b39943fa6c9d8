"""The import rule of issue 14, read from the source (AST), inner imports included.

``dispatchsite -> {ops, tools, api} -> tasks -> lanes -> (redis, kombu, celery, django)``:
``lanes`` never imports ``tasks`` (nor anything above it), ``tasks`` never imports
the apps above it, no app imports ``dispatchsite`` (apps reach Celery through
``current_app`` / ``shared_task``), the modules of ``lanes`` and ``tasks`` import
each other without a cycle (imports inside functions count: hiding one there is
how the old 8-module cycle survived), and an import that stays inside a function says why
with ``# inner import: <reason>`` on its line or the line above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("lanes", "tasks", "api", "ops", "tools")
#: What each package may not import (anywhere in a module, functions included).
FORBIDDEN = {
    "lanes": {"tasks", "api", "ops", "tools", "dispatchsite"},
    "tasks": {"api", "ops", "tools", "dispatchsite"},
    "api": {"ops", "tools", "dispatchsite"},
    "ops": {"dispatchsite"},
    "tools": {"dispatchsite"},
}
#: Exceptions to FORBIDDEN, by file: none since the ops and tools apps landed (keep it empty).
PENDING_MOVES: dict[str, set[str]] = {}
#: Files of lanes/tasks exempt from the inner-import rule: none (keep it empty).
INNER_RULE_PENDING: set[str] = set()
INNER_MARK = "# inner import:"


class Import:
    def __init__(self, module: str, line: int, inner: bool) -> None:
        self.module, self.line, self.inner = module, line, inner


def _modules() -> dict[str, Path]:
    found = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")) if (ROOT / app).is_dir() else []:
            if "migrations" in path.parts:
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


def _imports(path: Path, module: str) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[Import] = []

    def visit(node: ast.AST, inner: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_inner = inner or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(alias.name, child.lineno, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.split(".")[: -child.level if path.name != "__init__.py" else None]
                    if path.name == "__init__.py" and child.level > 1:
                        package = package[: 1 - child.level]
                    base = ".".join([*package, base] if base else package)
                # "from tasks import config" imports the module tasks.config when there is one
                found.extend(Import(f"{base}.{alias.name}", child.lineno, inner) for alias in child.names)
                found.append(Import(base, child.lineno, inner))
            visit(child, child_inner)

    visit(tree, False)
    return found


MODULES = _modules()
IMPORTS = {name: _imports(path, name) for name, path in MODULES.items()}


def _rel(name: str) -> str:
    return str(MODULES[name].relative_to(ROOT))


def test_no_forbidden_import_anywhere() -> None:
    wrong = []
    for name, imports in IMPORTS.items():
        app = name.split(".")[0]
        allowed = PENDING_MOVES.get(_rel(name), set())
        for imp in imports:
            top = imp.module.split(".")[0]
            pending = any(imp.module == a or imp.module.startswith(a + ".") or a.startswith(imp.module + ".")
                          for a in allowed)
            if top in FORBIDDEN[app] and not pending:
                wrong.append(f"{_rel(name)}:{imp.line} imports {imp.module}")
    assert not wrong, "imports against the layers (see docs/architecture.md):\n" + "\n".join(sorted(set(wrong)))


def _edges() -> dict[str, set[str]]:
    return {name: {imp.module for imp in imports if imp.module in MODULES and imp.module != name}
            for name, imports in IMPORTS.items() if name.split(".")[0] in ("lanes", "tasks")}


def test_no_import_cycle_between_modules_of_lanes_and_tasks() -> None:
    edges = _edges()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    # A package's __init__ importing its own submodules is not a cycle worth a failure.
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _says_why(lines: list[str], line: int) -> bool:
    """The mark on the import's line, or on a line of the block of imports and comments just above it."""
    index = line - 1
    if INNER_MARK in lines[index]:
        return True
    index -= 1
    while index >= 0 and (not lines[index].strip() or lines[index].strip().startswith(("from ", "import ", "#"))):
        if INNER_MARK in lines[index]:
            return True
        index -= 1
    return False


def inner_imports_without_reason() -> list[str]:
    missing = []
    for name, imports in IMPORTS.items():
        if name.split(".")[0] not in ("lanes", "tasks") or _rel(name) in INNER_RULE_PENDING:
            continue
        lines = MODULES[name].read_text().splitlines()
        for imp in imports:
            if not imp.inner or imp.module.split(".")[0] not in (*APPS, "dispatchsite"):
                continue
            if not _says_why(lines, imp.line):
                missing.append(f"{_rel(name)}:{imp.line} {imp.module}")
    return sorted(set(missing))


def test_every_inner_import_says_why() -> None:
    missing = inner_imports_without_reason()
    assert not missing, f"imports inside functions without '{INNER_MARK} <reason>':\n" + "\n".join(missing)


@pytest.mark.parametrize("package", ["lanes", "tasks"])
def test_the_rule_reads_this_package(package: str) -> None:
    """Guard against a test that passes because it read nothing."""
    assert sum(1 for name in IMPORTS if name.startswith(package + ".")) > 10
