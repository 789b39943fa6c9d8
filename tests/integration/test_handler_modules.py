"""Users' handlers live in their own modules, named by ``DISPATCH_HANDLER_MODULES``: no platform file edited.

A module outside the project (on ``PYTHONPATH``) declares a handler; a real
worker started with the setting runs it, and the admin's handler list (the
web side) offers it. A module that cannot be imported stops the process with a
message naming the setting and the module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.helpers import define, unique

ROOT = Path(__file__).resolve().parents[2]
LANE = "t-own-handlers"
HANDLER = "mine.shout"

MODULE = textwrap.dedent('''
    from tasks.registry import Context, handler


    @handler("mine.shout", option_keys=("suffix",))
    def shout(payload: dict, ctx: Context) -> dict:
        """Upper-cases payload["text"]: a user's own handler."""
        return {"text": payload["text"].upper() + ctx.options.get("suffix", ""), "type": ctx.type}
''')


@pytest.fixture(scope="module")
def own_module(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("own-handlers")
    (folder / "myhandlers_h29.py").write_text(MODULE)
    return folder


def _env(folder: Path, modules: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "DISPATCH_HANDLER_MODULES": modules}


def test_a_worker_runs_a_handler_from_a_module_the_setting_names(own_module, start_worker, tmp_root):
    from tasks.dispatch import dispatch

    # This (test) process plays the web side: it declares the handler as ready() would.
    sys.path.insert(0, str(own_module))
    try:
        from tasks.apps import import_modules

        import_modules("DISPATCH_HANDLER_MODULES", ["myhandlers_h29"])
    finally:
        sys.path.remove(str(own_module))
    start_worker(LANE, pool="threads", concurrency=2, env=_env(own_module, "myhandlers_h29"))
    type_name = unique("partner.shout")
    define(type_name, handler=HANDLER, lane=LANE, options={"suffix": "!"})
    result = dispatch.delay(type_name, {"text": "hello"})
    assert result.accepted, result
    assert result.get(timeout=60) == {"text": "HELLO!", "type": type_name}


def test_the_admin_offers_the_handler_a_setting_names(own_module):
    """A fresh process (as web or a command is) lists the handler in the registry the admin reads."""
    code = "import django; django.setup(); from tasks import registry; print(registry.handler_names())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(own_module, "myhandlers_h29"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert HANDLER in done.stdout


def test_a_module_that_cannot_be_imported_is_named(own_module):
    code = "import django; django.setup()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(own_module, "myhandlers_h29,no_such_mod"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "DISPATCH_HANDLER_MODULES: cannot import 'no_such_mod'" in done.stderr, done.stderr[-2000:]
