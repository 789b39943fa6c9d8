"""Each script carries only the ``_lib.lua`` blocks and ``lanes.keys`` constants it uses (lanes.lua.loader).

The loader parses ``_lib.lua`` into its top-level blocks and keeps those a script names, transitively, in
their order; a block left out must never be named by the script's code (it would be a nil global at run
time, on whichever path reaches it), and a block kept must be named by the body or another block kept.
The oracle here is deliberately cruder than the loader's lexer (any mention in a line's code before
``--``, outside one-line strings), so a mistake of that lexer that drops a used function shows up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lanes import keys
from lanes.lua import loader

LUA_DIR = loader.SCRIPT_DIR
TOOLS_DIR = Path(loader.__file__).parents[2] / "tools"
SCRIPTS = [(path.stem, None) for path in sorted(LUA_DIR.glob("*.lua")) if not path.stem.startswith("_")] + [
    (path.stem, TOOLS_DIR) for path in sorted(TOOLS_DIR.glob("*.lua"))]
LIB_TEXT = (LUA_DIR / "_lib.lua").read_text()
HEADER, BLOCKS = loader.parse_lib(LIB_TEXT)
DEFINED = [block.name for block in BLOCKS] + list(keys.LUA_CONSTANTS)


def _ids(param):
    return param if isinstance(param, str) else ("tools" if param else "lanes")


def _code(text: str) -> str:
    """Each line before its ``--``, without its one-line strings."""
    return re.sub(r"'[^'\n]*'|\"[^\"\n]*\"", "''", "\n".join(line.split("--", 1)[0] for line in text.splitlines()))


def _mentions(code: str, name: str) -> bool:
    return re.search(rf"(?<![\w.:]){re.escape(name)}\b", code) is not None


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^local (?:function )?{re.escape(name)}\b", source, re.M) is not None


def _left_out_but_named(source: str) -> list[str]:
    code = _code(source)
    return [name for name in DEFINED if not _defines(source, name) and _mentions(code, name)]


def test_the_blocks_put_together_are_lib_lua_itself():
    assert HEADER + "".join(block.text for block in BLOCKS) == LIB_TEXT
    assert {"publish_record", "hand_over", "finish_done_items", "LIM", "FINISH_ITEM_FIELDS"} <= set(DEFINED)


@pytest.mark.parametrize(("name", "directory"), SCRIPTS, ids=_ids)
def test_a_script_carries_every_lib_block_it_names(name, directory):
    source = loader._source(name, directory)
    assert not _left_out_but_named(source), f"{name}.lua names blocks the loader left out"


@pytest.mark.parametrize(("name", "directory"), SCRIPTS, ids=_ids)
def test_a_script_carries_only_lib_blocks_it_uses(name, directory):
    """Each block kept is named by the body or by another block kept (the old loader kept all of them)."""
    source = loader._source(name, directory)
    body = loader._body(name, directory or LUA_DIR)
    lazy = [section.text for section in loader.lazy_sections(body, directory or LUA_DIR)]
    kept = [block for block in loader._prelude_blocks() + BLOCKS if _defines(source, block.name)]
    for block in kept:
        users = [body, *lazy] + [other.text for other in kept if other is not block]
        assert any(block.name in loader.lua_names(text) for text in users), f"{name}.lua carries unused {block.name}"


def _in_order(text: str, old: str, what: str) -> None:
    lines = iter(old.splitlines(keepends=True))
    for line in text.splitlines(keepends=True):
        assert any(line == candidate for candidate in lines), f"{what}: {line!r} out of order or changed"


@pytest.mark.parametrize(("name", "directory"), SCRIPTS, ids=_ids)
def test_a_script_is_the_old_text_with_lines_left_out(name, directory):
    """Lines of prelude + _lib.lua + body, in that order, none changed; a lazy section's function
    (``--! lazy``) is, inside the lines the loader writes around it, prelude + _lib.lua + its file."""
    folder = directory or LUA_DIR
    lib = folder / "_lib.lua"
    lib_text = lib.read_text() + "\n" if lib.exists() else ""
    body = loader._body(name, folder)
    top, lazy = loader.split_lazy(loader._source(name, directory))
    _in_order(top, loader.prelude() + lib_text + body, f"{name}.lua")
    sections = loader.lazy_sections(body, folder)
    assert len(lazy) == len(sections)
    for section, text in zip(sections, lazy, strict=True):
        inner = text.splitlines(keepends=True)
        assert inner[1] == loader.LAZY_BEGIN.format(name=section.name, file=section.file)
        assert inner[-1] == loader.LAZY_END.format(name=section.name)
        _in_order("".join(inner[3:-3]), loader.prelude() + lib_text + section.text, f"{name}.lua's {section.name}")


def test_a_lazy_section_holds_what_only_it_uses():
    """admit.lua's plain path makes only what it runs (docs/redis-budget.md): the limits and the cancel's
    helpers are inside ``admit_rare``, the ring's and the record's at the top; each block once."""
    top, (rare,) = loader.split_lazy(loader._source("admit"))
    for name in ("lim_setup", "gate_publish", "cancel_record", "pend_flush", "admit_reject", "LIM"):
        assert _defines(rare, name) and not _defines(top, name), name
    for name in ("ring", "rings_for", "list_item", "caller_of", "admit_one", "read_item"):
        assert _defines(top, name) and not _defines(rare, name), name
    # Each is made again at every call: 38 were before the lazy section (253K instructions a call, 110K of
    # them the top level), 10 now (178K). A helper a plain item does not run belongs in _admit_rare.lua.
    assert len(re.findall(r"^local function ", top, re.M)) <= 10


def test_the_hot_scripts_leave_out_what_they_do_not_need():
    def lib_functions(name: str) -> set[str]:
        return {block.name for block in BLOCKS if _defines(loader._source(name), block.name)}

    assert lib_functions("forget") == set()
    assert "lim_release" not in lib_functions("pop_more") and "publish_record" not in lib_functions("start")
    assert "observe" not in lib_functions("admit")
    assert "finish_done_items" in lib_functions("claim_group") and "chat_tag" in lib_functions("finish_batch")


def test_dropping_a_used_block_is_caught():
    """The oracle of the tests above sees a function the loader would have dropped."""
    source = loader._source("admit")
    dropped = next(block for block in BLOCKS if block.name == "publish_record")
    assert dropped.text in source
    assert _left_out_but_named(source.replace(dropped.text, "")) == ["publish_record"]


def test_names_in_comments_and_strings_are_no_use():
    code = "-- ring(x)\nlocal a = 'hand_over' .. \"lim_drain\" --[==[ observe ]==] .. [[count_to]]\nfoo(b)\n"
    assert loader.lua_names(code) == {"local", "a", "foo", "b"}
    assert "bell_of" in loader.lua_names("x = 'it''s' .. bell_of(q) -- bell_bit")


def test_the_parser_refuses_what_it_cannot_place():
    with pytest.raises(ValueError, match="top-level code"):
        loader.parse_lib("local function a()\nend\nx = 1\n")
    with pytest.raises(ValueError, match="twice"):
        loader.parse_lib("local A = 1\nlocal function A()\nend\n")
    header, blocks = loader.parse_lib("-- head\n\nlocal function a()\n-- inside\n  return b_value\nend\n\n"
                                      "-- about b\nlocal b_value = 1\n")
    assert header == "-- head\n\n"
    assert [(b.name, b.text, b.uses) for b in blocks] == [
        ("a", "local function a()\n-- inside\n  return b_value\nend\n", {"b_value"}),
        ("b_value", "\n-- about b\nlocal b_value = 1\n", set())]
