"""A dead letter whose row PostgreSQL refuses still ends the task (issue 12, item 1).

Before the fix the refused insert raised out of the dead-letter path: the Redis
record stayed ``running``, its chat stayed blocked behind it, and the sweep ran
the handler again until the task went ``poison`` (which failed the same way).
"""

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

#: Refuses any dead-letter row whose payload has a "refuse" key, and every row of chat "refuse-all".
REFUSING_TRIGGER = """
CREATE FUNCTION refuse_dead_letter() RETURNS trigger AS $$
BEGIN
  IF NEW.payload ? 'refuse' OR NEW.chat_id = 'refuse-all' THEN
    RAISE EXCEPTION 'dead letter refused by the test trigger';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_dead_letter BEFORE INSERT ON tasks_deadletter
  FOR EACH ROW EXECUTE FUNCTION refuse_dead_letter();
"""

#: Run in ``manage.py shell`` on PostgreSQL: dispatch past admission's text check, wait for outcomes.
SCRIPT = r"""
import json
from tasks import validation
from tasks.dispatch import admit

validation.unstorable_text = lambda value, root: None  # force a NUL payload past admission
out = {}
plan = [
    ("nul", "pgdl.fail", {"fail": "fatal", "text": "a\x00b"}, "chat-nul"),
    ("nul_next", "pgdl.echo", {"n": 1}, "chat-nul"),
    ("trig", "pgdl.fail", {"fail": "fatal", "refuse": True}, "chat-trig"),
    ("trig_next", "pgdl.echo", {"n": 2}, "chat-trig"),
    ("lost", "pgdl.fail", {"fail": "fatal"}, "refuse-all"),
    ("lost_next", "pgdl.echo", {"n": 3}, "refuse-all"),
]
results = {}
for name, ttype, payload, chat in plan:
    r = admit(ttype, payload, chat_id=chat)
    assert r.accepted, (name, r)
    results[name] = r
for name, r in results.items():
    try:
        value = r.get(timeout=40, propagate=False)
        out[name] = {"id": r.task_id, "state": r.async_result().state, "result": repr(value)}
    except Exception as exc:
        out[name] = {"id": r.task_id, "state": "TIMEOUT", "result": repr(exc)}
print("RESULT" + json.dumps(out))
"""


def manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True, timeout=240)


def test_a_dead_letter_row_that_cannot_be_written_still_ends_the_task(tmp_root, rc):
    import psycopg

    from tests.support.postgres_server import PostgresServer

    server = PostgresServer().start()
    try:
        env = {**os.environ, "DATABASE_URL": server.url}
        manage(env, "migrate", "--verbosity", "0")
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(REFUSING_TRIGGER)
        config = tmp_root / "pgdl-config.json"
        config.write_text(json.dumps({
            "retry_policies": [{"name": "pgdl-once", "max_retries": 0}],
            "lanes": [{"name": "pgdl-lane"}],
            "task_types": [
                {"name": "pgdl.fail", "handler": "demo.flaky", "lane": "pgdl-lane", "retry_policy": "pgdl-once",
                 "chat_scoped": True},
                {"name": "pgdl.echo", "handler": "demo.echo", "lane": "pgdl-lane", "retry_policy": "pgdl-once",
                 "chat_scoped": True},
            ],
        }))
        manage(env, "apply_config", str(config))
        worker = Worker("pgdl-lane", tmp_root / "logs", concurrency=2, env={"DATABASE_URL": server.url}).start()
        try:
            out = manage(env, "shell", "-c", SCRIPT).stdout
        finally:
            worker.stop()
        log = worker.log_path.read_text(errors="replace")
    finally:
        rows = []
        try:
            with psycopg.connect(server.url) as conn:
                # This test's types only: the worker's maintenance also expires other tests' leftovers in the
                # shared Redis, and records them in this database (as test_postgres.py says).
                rows = conn.execute("SELECT task_id, chat_id, payload, error_message FROM tasks_deadletter"
                                    " WHERE task_type LIKE %s", ("pgdl.%",)).fetchall()
        finally:
            server.stop()

    results = json.loads(out.split("RESULT", 1)[1])
    # Each failing task ended dead, and its chat moved on to the next message.
    for name in ("nul", "trig", "lost"):
        assert results[name]["state"] == "FAILURE", results[name]
        assert results[f"{name}_next"]["state"] == "SUCCESS", results[f"{name}_next"]
    # Nothing is left running in Redis, and every handler ran exactly once.
    for name in ("nul", "trig", "lost"):
        task_id = results[name]["id"]
        assert log.count(f"dead_letter_write_failed task={task_id}") == 1
    started = rc.hget("dispatch:m:total", "started|pgdl-lane|pgdl.fail")
    assert int(started) == 3
    # What could be stored was stored, with a note; the row that could not be is counted.
    by_chat = {row[1]: row for row in rows}
    assert set(by_chat) == {"chat-nul", "chat-trig"}
    assert "a\\x00b" in by_chat["chat-nul"][2]["unstorable_payload"]
    assert "refused as written" in by_chat["chat-nul"][3]
    assert "'refuse': True" in by_chat["chat-trig"][2]["unstorable_payload"]
    assert f"dead_letter_lost task={results['lost']['id']}" in log
    assert int(rc.hget("dispatch:m:total", "dead_letter_write_failures|pgdl-lane|pgdl.fail")) == 1
