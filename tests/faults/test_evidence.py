"""A failed scenario keeps its evidence: Redis data another redis-server loads, the logs, the
checker's per-chat timeline, in a folder its failure message names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lanes import keys
from tests.faults import conftest as faults_conftest
from tests.faults.harness import EVIDENCE, drain_and_check
from tests.support.helpers import unique
from tests.support.redis_server import RedisServer


class _Outcome:
    def __init__(self, rep) -> None:
        self.rep = rep

    def get_result(self):
        return self.rep


def test_a_stuck_scenario_keeps_redis_data_logs_and_the_chat_timeline(cluster_factory, tmp_path, request):
    cluster = cluster_factory()
    lane = unique("fl-evid")
    name = cluster.http_type(lane)
    # No worker: every accepted message stays in Redis, the state of a stuck chat.
    load = cluster.constant_load(name, rate=10, duration=1.0, chats=2)
    load.wait(timeout=60)
    rep = drain_and_check(cluster, [load], scenario="evidence", drain_bound=0.5, lanes=[lane], settle=0,
                          residue_wait=0)
    assert rep.stuck == rep.accepted > 0

    folder = cluster.keep_evidence("test_evidence[x]")
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    assert folder.parent.name == "evidence" and folder.name.startswith("test_evidence_x_-")
    timeline = json.loads((folder / "timeline.json").read_text())
    chats = {op.chat for op in load.ops() if op.accepted}
    assert set(timeline["unfinished_chats"]) == chats
    for chat in chats:
        messages = timeline["chats"][chat]
        assert [m["seq"] for m in messages] == sorted(m["seq"] for m in messages)
        assert all(m["end"] == "none" and m["dispatched_at"] for m in messages)
    state = json.loads((folder / "redis-state.json").read_text())
    assert set(state["chats"]) == chats
    head = {chat: state["chats"][chat]["queue"][0] for chat in chats}
    assert all(state["chats"][chat]["records"][head[chat]]["st"] == "queued" for chat in chats)
    assert (folder / "logs" / load.log_path.name).exists() and (folder / "logs" / load.history_path.name).exists()

    # The Redis data loads in another redis-server, with every chat queue as it was: from the AOF,
    # and from the RDB alone.
    for source in ("aof", "rdb"):
        copy = tmp_path / source
        shutil.copytree(folder / "redis", copy)
        if source == "rdb":
            for aof in [*copy.glob("appendonly*")]:  # a file (Redis 6) or a folder (Redis 7)
                shutil.rmtree(aof) if aof.is_dir() else aof.unlink()
        server = RedisServer(copy, cluster.redis.password, appendonly=source == "aof").start()
        try:
            c = server.client()
            for chat in chats:
                assert c.lindex(keys.chat_queue(chat), 0).decode() == head[chat], source
        finally:
            server.stop()


def test_the_failure_message_names_the_evidence_folder(cluster_factory, request):
    """The report hook keeps the evidence before the teardown, while the scenario's Redis answers."""
    cluster = cluster_factory()
    cluster.client().rpush(keys.chat_queue("evid"), "t1")

    def failing():
        raise AssertionError("scenario failed")

    class Item:
        name = "test_x"
        fault_clusters = [cluster]

    call = pytest.CallInfo.from_call(failing, when="call")
    rep = pytest.TestReport(nodeid="t::x", location=("t", 0, "x"), keywords={}, outcome="failed",
                            longrepr=call.excinfo.getrepr(), when="call")
    hook = faults_conftest.pytest_runtest_makereport.__wrapped__(Item(), call) \
        if hasattr(faults_conftest.pytest_runtest_makereport, "__wrapped__") \
        else faults_conftest.pytest_runtest_makereport(Item(), call)
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(_Outcome(rep))
    text = str(rep.longrepr)
    assert "evidence kept in: " in text, text
    folder = Path(text.split("evidence kept in: ", 1)[1].split(" ", 1)[0])
    assert folder.parent == EVIDENCE and folder.name == f"test_x-{cluster.dir.name}"
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    state = json.loads((folder / "redis-state.json").read_text())
    assert state["chats"]["evid"]["queue"] == ["t1"]
    assert (folder / "redis" / "dump.rdb").exists()
