"""Names retired by the cleanup: the aliases are gone, and the one documented for users still works, with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest


@pytest.mark.parametrize("module", ["lanes.scripts", "tasks.leases", "tasks.messages"])
def test_internal_aliases_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_moved_config_version_names_are_no_longer_in_lanes_signals():
    import lanes.signals

    assert not hasattr(lanes.signals, "bump_config_version")


def test_tasks_hooks_gives_the_same_signals_and_warns():
    import tasks.signals

    sys.modules.pop("tasks.hooks", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks = importlib.import_module("tasks.hooks")
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "tasks.signals" in str(caught[0].message)
    for name in ("TaskInfo", "task_queued", "task_rejected", "task_started", "task_finished"):
        assert getattr(hooks, name) is getattr(tasks.signals, name)
