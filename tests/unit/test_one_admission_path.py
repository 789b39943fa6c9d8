"""One admission path, read from the source (AST): every dispatch, a lone ``dispatch.delay`` or a chunk of
``dispatch_many``, walks the steps in ``tasks.bulk.Admission`` and reaches admit.lua through
``lanes.lua.admit.Calls`` alone. A second walk of the steps (``prepare`` called elsewhere) or a second way to
call the script (``script(NAME)``, ``call(NAME, ...)``, a stream or an ``EVALSHA`` outside ``Calls``) fails here;
``tests/integration/test_dispatch_alone.py`` counts the same at run time."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("lanes", "tasks", "api", "ops", "tools", "dispatchsite")


def _parse(path: Path) -> ast.Module:
    """``ast.parse``, again if CPython 3.11's AST builder, whose depth count is shared by threads, says
    "recursion depth mismatch" (python/cpython#106905): a module compiled meanwhile by another thread (a fresh
    clone's first import, no .pyc yet) can cause it; the source is not at fault."""
    for _ in range(4):
        try:
            return ast.parse(path.read_text(), str(path))
        except SystemError:
            continue
    return ast.parse(path.read_text(), str(path))


def _modules() -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): _parse(path)
            for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))}


def _in_scopes(tree: ast.Module, kind: type[ast.AST]) -> list[tuple[str, ast.AST]]:
    """Every node of ``kind`` in a module, with the qualified name of the function or class it is written in."""
    found: list[tuple[str, ast.AST]] = []

    def walk(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walk(child, f"{scope}.{child.name}" if scope else child.name)
                continue
            if isinstance(child, kind):
                found.append((scope, child))
            walk(child, scope)

    walk(tree, "")
    return found


def _calls_in_scopes(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    return _in_scopes(tree, ast.Call)  # type: ignore[return-value]


def _name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _names_admit(path: str, node: ast.AST) -> bool:
    """Whether an argument names admit.lua: its wrapper's ``NAME`` (``admit.NAME`` elsewhere) or the text 'admit'."""
    return (isinstance(node, ast.Name) and node.id == "NAME" and path == "lanes/lua/admit.py") or (
        isinstance(node, ast.Attribute) and node.attr == "NAME" and ast.unparse(node.value).endswith("admit")) or (
        isinstance(node, ast.Constant) and node.value == "admit")


def test_admit_lua_is_called_only_by_calls():
    runs, by_hand = [], []
    for path, tree in _modules().items():
        for scope, call in _calls_in_scopes(tree):
            if _name(call) in ("script", "call", "ScriptStream", "register_script", "evalsha", "eval") \
                    and call.args and _names_admit(path, call.args[0]):
                runs.append((path, scope, _name(call)))
        for scope, text in _in_scopes(tree, ast.JoinedStr):
            if "EVALSHA" in ast.unparse(text):
                by_hand.append((path, scope))
    assert runs == [("lanes/lua/admit.py", "Calls.__init__", "ScriptStream")], runs
    # An EVALSHA written in Redis' protocol by hand: the stream's, for every packed call, and nowhere else.
    assert by_hand == [("lanes/lua/loader.py", "_pack")], by_hand


def test_the_steps_are_walked_only_by_admission():
    """``prepare`` (validation and the item) runs in ``Admission._prepare`` only, ``admit.Calls`` is opened by
    ``Admission.run`` only: no function takes a dispatch's steps on its own."""
    preparing, calling = [], []
    for path, tree in _modules().items():
        for scope, call in _calls_in_scopes(tree):
            if _name(call) == "prepare" and isinstance(call.func, ast.Name):
                preparing.append((path, scope))
            if _name(call) == "Calls":
                calling.append((path, scope))
    assert preparing == [("tasks/bulk.py", "Admission._prepare")], preparing
    assert calling == [("tasks/bulk.py", "Admission.run")], calling
