"""`make run`'s worker defaults and banner (scripts/run.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_script", ROOT / "scripts" / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)


def test_defaults_are_sized_for_io_bound_work_and_serve_the_celery_queue():
    groups = run.worker_groups({})
    assert groups["realtime"] == {"queues": "realtime", "pool": "threads", "concurrency": 16, "instances": 2,
                                  "catch_all": False}
    assert "celery" in groups["default"]["queues"].split(",") and "ingress" in groups["default"]["queues"]
    assert all(g["pool"] == "threads" for g in groups.values())
    assert groups["default"]["catch_all"] is True  # run-time lanes always have a consumer


def test_knobs_override_in_order():
    env = {"WORKER_POOL": "prefork", "WORKER_CONCURRENCY": "4", "WORKER_REALTIME_CONCURRENCY": "32",
           "WORKER_REALTIME_INSTANCES": "3", "WORKER_GROUPS": '{"realtime": "realtime", "extra": "x,y"}'}
    groups = run.worker_groups(env)
    assert groups["realtime"] == {"queues": "realtime", "pool": "prefork", "concurrency": 32, "instances": 3,
                                  "catch_all": False}
    assert groups["extra"] == {"queues": "x,y", "pool": "prefork", "concurrency": 4, "instances": 1,
                               "catch_all": False}


def test_readme_shows_the_banner_run_prints():
    printed = run.banner(ROOT / ".dispatch-secrets.json", 8000, 5555).strip("\n")
    assert f"```\n{printed}\n```" in (ROOT / "README.md").read_text()


def test_the_banner_names_the_credentials_file_never_a_credential(tmp_path):
    from dispatchsite.secrets import load_secrets

    path = tmp_path / "secrets.json"
    secrets = load_secrets(path)
    printed = run.banner(path, 8000, 5555)
    assert str(path) in printed
    assert not [name for name, value in secrets.items() if value in printed]


def test_smsload_starts_the_realtime_group_make_run_starts(monkeypatch):
    # One definition (tasks.worker_groups): smsload's workers are make run's realtime group, its
    # overrides included, so what the SMS demo measures is what make run would run it on.
    from tools import smsload

    def shape_of(bench):
        return {"instances": bench.instances, "pool": bench.io_pool, "concurrency": bench.io_concurrency}

    realtime = run.worker_groups({})["realtime"]
    assert shape_of(smsload.default_bench()) == {k: realtime[k] for k in ("instances", "pool", "concurrency")}
    monkeypatch.setenv("WORKER_REALTIME_CONCURRENCY", "24")
    monkeypatch.setenv("WORKER_REALTIME_INSTANCES", "3")
    assert shape_of(smsload.default_bench()) == {"instances": 3, "pool": realtime["pool"], "concurrency": 24}
