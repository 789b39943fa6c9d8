"""Every script, as the loader now builds it (only the ``_lib.lua`` blocks it uses), compiles in a real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes.lua import loader

TOOLS_DIR = Path(loader.__file__).parents[2] / "tools"
SCRIPTS = [(path.stem, None) for path in sorted(loader.SCRIPT_DIR.glob("*.lua")) if not path.stem.startswith("_")] + [
    (path.stem, TOOLS_DIR) for path in sorted(TOOLS_DIR.glob("*.lua"))]


@pytest.mark.parametrize(("name", "directory"), SCRIPTS, ids=lambda p: p if isinstance(p, str) else "")
def test_every_script_compiles_in_redis(rc, name, directory):
    source = loader._source(name, directory)
    assert rc.script_load(source) == loader.script(name, directory).sha
