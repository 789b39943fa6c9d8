"""The Lua scripts name their KEYS and ARGV once, at the top, and take key suffixes from ``lanes.keys``.

A script reads ``KEYS[n]`` / ``ARGV[n]`` only before its first Redis command
(its named locals, and the reader of a chunk's items), never in the body; the
helpers it includes (``_lib.lua``, ``_admit.lua``) never. A suffix that
``lanes.keys`` defines (``keys.LUA_CONSTANTS``, which the loader writes ahead
of every script as Lua locals of the same names) is never written again as a
literal in a concatenation.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lanes import keys
from lanes.lua import loader

LUA_DIR = Path(loader.__file__).parent
SCRIPTS = sorted(LUA_DIR.glob("*.lua"))
POSITIONAL = re.compile(r"\b(?:KEYS|ARGV)\[")


def _code(path: Path) -> list[tuple[int, str]]:
    """(line number, code without its comment) of each line of ``path``."""
    return [(number, line.split("--", 1)[0]) for number, line in enumerate(path.read_text().splitlines(), 1)]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_keys_and_argv_are_read_only_before_the_first_redis_command(path):
    lines = _code(path)
    if path.stem.startswith("_"):  # included helpers take named values from their caller
        assert not [n for n, code in lines if POSITIONAL.search(code)], f"{path.name} reads KEYS/ARGV"
        return
    first_call = next((n for n, code in lines if "redis.call(" in code or "--! include" in code), len(lines) + 1)
    late = [n for n, code in lines if POSITIONAL.search(code) and n > first_call]
    assert not late, f"{path.name} reads KEYS/ARGV by position in its body, lines {late}"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_script_writes_a_suffix_that_lanes_keys_defines(path):
    code = "\n".join(line for _, line in _code(path))
    for name in keys.LUA_CONSTANTS:
        value = re.escape(getattr(keys, name))
        found = re.search(rf"\.\.\s*'{value}'|'{value}'\s*\.\.", code)
        assert not found, f"{path.name} writes {found.group(0)!r}: use {name} (lanes.keys)"
    assert "}:'" not in code, f"{path.name} writes a chat key's suffix after its tag: use CHAT_*_SUFFIX"


def test_the_prelude_names_each_constant_with_its_value_in_python():
    prelude = loader.prelude()
    for name in keys.LUA_CONSTANTS:
        assert f"local {name} = '{getattr(keys, name)}'\n" in prelude
    source, lazy = loader.split_lazy(loader._source("admit"))  # the constants it uses, in the prelude's order, first
    used = [line for line in prelude.splitlines(keepends=True) if line in source]
    assert used and source.startswith("".join(used))
    for section in lazy:  # and a lazy section's own, first in its function
        used = [line for line in prelude.splitlines(keepends=True) if line in section]
        assert used and "".join(section.splitlines(keepends=True)[3:3 + len(used)]) == "".join(used)


def test_the_keys_built_in_python_use_the_same_suffixes():
    base = keys.limit_base("tg", "k")
    assert keys.limit_waiting(base) == base + keys.LIMIT_WAITING_SUFFIX
    assert keys.lane_waiting("l") == keys.LANE_PREFIX + "l" + keys.LANE_WAITING_SUFFIX
    assert keys.chat_queue("c") == keys.CHAT_PREFIX + "{c}" + keys.CHAT_QUEUE_SUFFIX
    assert keys.task_record("t", "c") == keys.CHAT_PREFIX + "{c}" + keys.CHAT_RECORDS_SUFFIX + "t"
    assert keys.limit_instances("tg") == keys.LIMIT_PREFIX + keys.LIMIT_INSTANCES_INFIX + "tg"


def test_admit_lua_and_its_wrapper_agree_on_the_layout():
    from lanes.lua import admit

    layout = r"local SHARED_KEYS, SHARED_ARGS, ITEM_ARGS = (\d+), (\d+), (\d+)"
    found = re.search(layout, (LUA_DIR / "admit.lua").read_text())
    assert found and tuple(map(int, found.groups())) == (admit.SHARED_KEYS, admit.SHARED_ARGS, admit.ITEM_ARGS)
    chunk = admit.Chunk("1", 0.0, "l", "t", True, 1, 1, 1, 1)
    assert len(admit.shared_keys(chunk)) == admit.SHARED_KEYS
    assert len(admit.shared_args(chunk, True)) == admit.SHARED_ARGS
