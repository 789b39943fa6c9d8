"""Nothing above ``lanes/lua/`` reads a script's reply by position.

Each wrapper in ``lanes/lua/<name>.py`` decodes its script's reply once and
returns a named value (``Started``, ``Finished``, ``Retried``, ...). A module
that indexes what a wrapper returned (``reply[0]``, ``reply[1:]``) would tie
itself to the script's reply layout again: this test reads the source of every
module outside ``lanes/lua/`` and fails on such a subscript, on the wrapper's
call itself or on a name bound from an expression that names a wrapper
(``reply = until_answered(lambda: lua_finish(...))``, ``functools.partial``).
A subscript by a variable (one reply per item of a chunk) is not a position.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["lanes", "tasks", "ops", "api", "tools", "dispatchsite"]
LUA = ROOT / "lanes" / "lua"
#: Modules of ``lanes.lua`` that are not a script's wrapper.
NOT_WRAPPERS = {"lanes.lua.loader", "lanes.lua"}


def _modules() -> list[Path]:
    paths = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if LUA in path.parents or "migrations" in path.parts:
                continue
            paths.append(path)
    return paths


def _wrapper_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names imported from a wrapper module, aliases of wrapper modules) in ``tree``."""
    functions: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("lanes.lua.") and node.module not in NOT_WRAPPERS:
                functions.update(alias.asname or alias.name for alias in node.names)
            elif node.module == "lanes.lua":
                modules.update(alias.asname or alias.name for alias in node.names
                               if f"lanes.lua.{alias.name}" not in NOT_WRAPPERS)
    return functions, modules


def _names_a_wrapper(node: ast.AST, functions: set[str], modules: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in functions:
            return True
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in modules:
            return True
    return False


def _positional(index: ast.AST) -> bool:
    if isinstance(index, ast.Slice):
        return True
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
        index = index.operand
    return isinstance(index, ast.Constant) and isinstance(index.value, int)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope``, without those of the functions and classes defined in it (their own scopes)."""
    nodes, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        nodes.append(node)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def _parse(source: str) -> ast.Module:
    """ast.parse, again on CPython 3.11's spurious "AST constructor recursion depth mismatch": its AST
    state is per interpreter, so another thread compiling at that moment (an import from source, with
    PYTHONDONTWRITEBYTECODE) can trip it (a CPython 3.11 bug seen here once in a whole suite)."""
    for _ in range(4):
        try:
            return ast.parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
            error = exc
    raise error


def reply_indexing(source: str) -> list[int]:
    """Line numbers where ``source`` reads a wrapper's reply by position."""
    tree = _parse(source)
    functions, modules = _wrapper_names(tree)
    if not functions and not modules:
        return []
    found = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (*_SCOPES, ast.Module))]
    for scope in scopes:
        replies = set()
        for node in _own_nodes(scope):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                    and _names_a_wrapper(node.value, functions, modules):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                replies.update(t.id for t in targets if isinstance(t, ast.Name))
        for node in _own_nodes(scope):
            if not isinstance(node, ast.Subscript) or not _positional(node.slice):
                continue
            value = node.value
            if (isinstance(value, ast.Name) and value.id in replies) or \
                    (isinstance(value, ast.Call) and _names_a_wrapper(value.func, functions, modules)):
                found.append(node.lineno)
    return sorted(set(found))


def test_no_module_above_lanes_lua_indexes_a_script_reply():
    offenders = {}
    for path in _modules():
        lines = reply_indexing(path.read_text())
        if lines:
            offenders[str(path.relative_to(ROOT))] = lines
    assert not offenders, f"a script's reply read by position (use the wrapper's named fields): {offenders}"


def test_the_check_finds_each_way_a_reply_is_indexed():
    """The forms the execution path used before its wrappers returned named values."""
    bound_through_a_call = (
        "from lanes.lua.finish import finish as lua_finish\n"
        "def f():\n"
        "    reply = until_answered(lambda: lua_finish(task_id='t'), 'finish', 't')\n"
        "    return reply[0] == b'taken', reply[1:]\n"
    )
    assert reply_indexing(bound_through_a_call) == [4]
    through_partial = (
        "import functools\nfrom lanes.lua.start import start\n"
        "def f():\n    reply = until_answered(functools.partial(start, x=1))\n    return reply[2]\n"
    )
    assert reply_indexing(through_partial) == [5]
    directly = "from lanes.lua import sweep\ndef f():\n    return sweep.sweep(now_ms=1)[0]\n"
    assert reply_indexing(directly) == [3]
    by_item = (
        "from lanes.lua import admit\n"
        "def f(n):\n    replies = admit.receive()\n    return [replies[i] for i in range(n)], replies.count\n"
    )
    assert reply_indexing(by_item) == []
    named = "from lanes.lua.start import start\ndef f():\n    reply = start()\n    return reply.status\n"
    assert reply_indexing(named) == []
    loader = "from lanes.lua.loader import call\ndef f():\n    return call('x', [], [])[0]\n"
    assert reply_indexing(loader) == []
    same_name_elsewhere = (
        "from lanes.lua.cancel import cancel\n"
        "def f():\n    found = cancel()\n    return found.outcome\n"
        "def g():\n    found = [1]\n    return found[0]\n"
    )
    assert reply_indexing(same_name_elsewhere) == []
