"""The platform on PostgreSQL (DATABASE_URL), end to end through the shell commands a user runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.postgres_server import find_bindir
from tests.support.workers import ROOT, Worker

pytestmark = pytest.mark.skipif(
    find_bindir() is None and not os.environ.get("CI"),
    reason="PostgreSQL is not installed: apt-get install postgresql (CI installs it)",
)


def manage(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=check, timeout=120)


def test_dispatch_results_and_dead_letters_on_postgres(tmp_root):
    from tests.support.postgres_server import PostgresServer

    server = PostgresServer().start()
    try:
        env = {**os.environ, "DATABASE_URL": server.url}
        manage(env, "migrate", "--verbosity", "0")
        config = tmp_root / "pg-config.json"
        config.write_text(json.dumps({
            "retry_policies": [{"name": "pg-once", "max_retries": 0}],
            "lanes": [{"name": "pg-lane"}],
            "task_types": [
                {"name": "pg.echo", "handler": "demo.echo", "lane": "pg-lane", "retry_policy": "pg-once"},
                {"name": "pg.fail", "handler": "demo.flaky", "lane": "pg-lane", "retry_policy": "pg-once"},
            ],
        }))
        manage(env, "apply_config", str(config))
        worker = Worker("pg-lane", tmp_root / "logs", concurrency=2, env={"DATABASE_URL": server.url}).start()
        try:
            out = manage(env, "dispatch", "pg.echo", "--payload", '{"db": "postgres"}', "--wait")
            reply = json.loads(out.stdout)
            assert reply["accepted"] and reply["state"] == "SUCCESS" and reply["result"] == {"db": "postgres"}
            failed = manage(env, "dispatch", "pg.fail", "--payload", '{"fail": "fatal"}', "--wait", check=False)
            assert failed.returncode == 3, failed.stderr  # dead-lettered: dispatch --wait's documented exit code
            assert json.loads(failed.stdout)["state"] == "FAILURE"
            rows = json.loads(manage(env, "deadletters", "--json").stdout)
            # Only this test's types: the maintenance of this worker also expires other tests'
            # leftovers in the shared Redis, and records them in this database.
            assert [r["reason"] for r in rows if r["type"].startswith("pg.")] == ["non_retryable"]
        finally:
            worker.retire()
        # The raw result upsert on PostgreSQL: overwrite, and one id twice in one statement.
        row = "{'task_id': 'pg-upsert', 'status': %r, 'result': %r, 'content_type': 'application/json', " \
              "'content_encoding': 'utf-8'}"
        manage(env, "shell", "-c", "from tasks.results import upsert_rows; "
               f"upsert_rows(None, [{row % ('SUCCESS', '1')}]); "
               f"upsert_rows(None, [{row % ('FAILURE', '2')}, {row % ('SUCCESS', '3')}])")
        import psycopg

        with psycopg.connect(server.url) as conn:
            # This test's rows (the worker's maintenance may record other tests' leftovers here, as above).
            mine = [reply["task_id"], json.loads(failed.stdout)["task_id"], "pg-upsert"]
            (count,) = conn.execute("SELECT count(*) FROM django_celery_results_taskresult WHERE task_id = ANY(%s)",
                                    (mine,)).fetchone()
            upserted = conn.execute("SELECT status, result, date_created <= date_done "
                                    "FROM django_celery_results_taskresult WHERE task_id = 'pg-upsert'").fetchall()
        assert count == 3
        assert upserted == [("SUCCESS", "3", True)]
    finally:
        server.stop()
