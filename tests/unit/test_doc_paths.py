"""Every repository path the docs name exists, so a reader who opens one finds it.

Read from the text: a path is a run of path characters that starts with one of
the repository's top folders (``tasks/foo.py``, ``lanes/lua/x.lua``,
``benchmarks/y.json``, ``tests/support/``; a last part with no dot, as in
``tasks/s``, is a unit, not a file), and a Markdown link's target
(relative to the document); a script or module named alone (``finish.lua``)
exists at the top or in one of those folders. ``{a,b}`` alternatives are expanded and ``*`` globs
must match something; ``<name>`` placeholders and URLs are skipped.
``benchmarks/archive.md`` is exempt: it is the dated history, quoted as
written, and its header says that it names paths of its day.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "BENCHMARKS.md", "FAULTS.md", *sorted(p.relative_to(ROOT).as_posix()
                                                         for p in (ROOT / "docs").glob("*.md"))]
TOP = ("api", "benchmarks", "dispatchsite", "docs", "lanes", "ops", "scripts", "tasks", "templates", "tests", "tools")
#: A path: a top folder, a slash, then path characters (braces and globs included).
PATH = re.compile(r"(?<![\w./~$-])(?:" + "|".join(TOP) + r")/[\w./*{},<>-]*")
#: A script or module named alone (``finish.lua``): it must exist under one of the top folders.
BARE = re.compile(r"(?<![\w./-])[\w-]+\.(?:lua|py)(?![\w.])")
#: Files a doc asks the reader to write (the README's own handler module): not the repository's.
READER_FILES = {"myhandlers.py"}
#: A Markdown link's target.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def expand(path: str) -> list[str]:
    """``a{,-2}.json`` -> ``a.json``, ``a-2.json`` (one brace group after another)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [out for alt in match.group(1).split(",")
            for out in expand(path[:match.start()] + alt + path[match.end():])]


def exists(path: str, base: Path = ROOT) -> bool:
    if "*" in path:
        return bool(glob.glob(path, root_dir=base, recursive=True))
    return (base / path).exists()


def named_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.finditer(text):
        path = match.group(0).rstrip(".,:;")
        last = path.rstrip("/").rsplit("/", 1)[-1]
        if "<" in path or ">" in path or not (path.endswith("/") or "." in last or "*" in last):
            continue  # a placeholder, or a unit (``tasks/s``) rather than a file
        found.update(expand(path))
    return found


def missing_paths(doc: str) -> list[str]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    missing = sorted(p for p in named_paths(text) if not exists(p))
    for name in sorted(set(BARE.findall(text)) - READER_FILES):
        if not (ROOT / name).exists() and not any(glob.glob(f"{top}/**/{name}", root_dir=ROOT, recursive=True)
                                                  for top in TOP):
            missing.append(name)
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or re.match(r"[a-z]+:", target) or "<" in target:
            continue
        if not exists(target, (ROOT / doc).parent):
            missing.append(f"link {target}")
    return missing


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc):
    assert missing_paths(doc) == [], f"{doc} names paths that do not exist"


def test_the_archive_says_it_is_exempt():
    head = (ROOT / "benchmarks" / "archive.md").read_text(encoding="utf-8")[:1500]
    assert "paths of its day" in head


def test_the_reader_finds_what_a_wrong_path_looks_like():
    text = ("`tasks/dispatch.py` and `lanes/lua/no_such.lua`, `benchmarks/x{,-2}.json`, "
            "`tasks/handlers/*.py`, `lanes/lua/<name>.lua`, /tmp/tasks/x.py, http://h/tasks/y.py")
    assert named_paths(text) == {"tasks/dispatch.py", "lanes/lua/no_such.lua", "benchmarks/x.json",
                                 "benchmarks/x-2.json", "tasks/handlers/*.py"}
    assert [p for p in sorted(named_paths(text)) if not exists(p)] == [
        "benchmarks/x-2.json", "benchmarks/x.json", "lanes/lua/no_such.lua"]
