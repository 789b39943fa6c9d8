"""Liveness, as a stateful property: the real Lua scripts, through their wrappers, on the session's
real Redis, driven by Hypothesis with faults among the steps.

Workers are modelled (each a process id with an in-hand and a held set, beating its liveness and
renewing its leases on a clock the test moves); everything they do is a script call: pop_more,
start, finish, retry, cancel, and the maintenance steps (sweep, reclaim, audit, expire, promote,
limits). Faults: a worker dies holding messages, a claim never reaches Redis, a script's reply is
lost after it ran (a pop's, a claim's, a finish's), an attempt overruns, leases run out (the clock
jumps), Redis restarts from its AOF. After every step: no chat
has two tasks in flight, each chat's queue keeps its dispatch order, every accepted task is in one
place its state names (queued, in hand, running, delayed, limited, finished). At the end, once the
faults stop and maintenance runs for a lease and a sweep, every accepted task has finished or is dead.

``HYPOTHESIS_MAX_EXAMPLES`` runs it longer (tests/support/hypothesis_profile.py). A deliberately
broken ``hand_over`` (``MUTANT``) must make it fail: ``test_a_broken_hand_over_is_caught``.
"""

from __future__ import annotations

import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from hypothesis import Phase
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from lanes import keys, leases
from lanes.lua import loader
from lanes.lua.cancel import cancel as lua_cancel
from lanes.lua.finish import Finished
from lanes.lua.finish import finish as lua_finish
from lanes.lua.forget import forget
from lanes.lua.limits_due import drain_due
from lanes.lua.pop_more import pop_more
from lanes.lua.promote import promote
from lanes.lua.reclaim import reclaim
from lanes.lua.retry import retry as lua_retry
from lanes.lua.start import Started
from lanes.lua.start import start as lua_start
from lanes.lua.sweep import sweep
from lanes.redis_client import get_redis
from tasks import config
from tasks.dispatch import admit
from tasks.maintenance import audit_chats, expire_due
from tests.support.helpers import define, unique
from tests.support.hypothesis_profile import bounded

LEASE_MS = int(settings.DISPATCH_LEASE_S * 1000)
QUEUED_MS = int(settings.DISPATCH_QUEUED_LEASE_S * 1000)
ATTEMPT_S = 2
#: The chat audit's hold: a head held this long by an owner that cannot move it is repaired.
HELD_MS = ATTEMPT_S * 1000 + LEASE_MS
CHATS = ["c0", "c1", "c2"]
#: Real restarts of the session's Redis in one run of the model (the others make its effects at once).
REAL_RESTARTS = 2
FINISHED = {"done", "dead", "cancelled"}
STATES = {"queued", "scheduled", "running", "retry", "limited", *FINISHED}
#: Rounds of maintenance and a healthy worker the liveness check allows.
ROUNDS = 12
#: hand_over with its head left in place: the finished head is published again and the chat never moves.
MUTANT = ("  redis.call('LPOP', chat_queue)\n", "")


class World:
    """The types, lane and limit the model dispatches to (made once per session)."""

    lane = ""
    types: dict[str, str] = {}


def _setup_world() -> None:
    if World.lane:
        return
    from tasks.models import Limit, TaskTypeLimit

    lane = unique("lm")
    types = {"plain": unique("lm-plain"), "chat": unique("lm-chat"), "limited": unique("lm-lim")}
    for kind, name in types.items():
        tt = define(name, lane=lane, chat_scoped=kind == "chat", chat_queue_size=64, attempt_timeout=ATTEMPT_S,
                    timeout=3600, policy={"max_retries": 2})
        if kind == "limited":
            lim, _ = Limit.objects.update_or_create(name=unique("lmlim"), defaults={"scope": "global",
                                                                                      "max_in_flight": 1})
            lim.full_clean()
            TaskTypeLimit.objects.filter(task_type=tt).delete()
            TaskTypeLimit.objects.create(task_type=tt, limit=lim, position=0)
    config.forget()
    World.lane, World.types = lane, types


class Worker:
    def __init__(self, proc: str) -> None:
        self.proc = proc
        self.owner = f"{proc}:1"
        self.in_hand: list[tuple[str, bytes]] = []  # (record, message)
        self.running: dict[str, int] = {}  # record -> attempt
        self.unsettled: list[str] = []


@contextmanager
def as_process(proc: str):
    """pop_more names the records in the calling process's in-hand set: here, a modelled worker's."""
    with mock.patch.object(leases, "process_id", lambda pid=None: proc), \
            mock.patch.object(leases.current(), "registered", lambda: True):
        yield


def _task_id(record: str) -> str:
    return record.rsplit(":", 1)[1]


def _chat_of(record: str) -> str:
    match = re.search(r"\{(.*)\}:t:", record)
    return match.group(1) if match else ""


class LivenessModel(RuleBasedStateMachine):
    """Rules draw the same values whatever Redis answered (no precondition reads the model's state
    beyond ``faults``): a rule with nothing to act on does nothing, so Hypothesis can replay a prefix."""

    #: Real restarts of the session's Redis made so far this run (``redis_restarts_from_its_aof``).
    real_restarts = 0

    def __init__(self) -> None:
        super().__init__()
        _setup_world()
        self.rc = get_redis()
        self.run_id = unique("m")
        self.lane = World.lane
        self.lists = keys.lane_queues(self.lane)
        # Each example starts with its lane empty (stale copies of earlier examples' tasks gone).
        self.rc.delete(*self.lists, keys.lane_doorbell(self.lane), keys.lane_delayed(self.lane))
        self.offset_ms = 0
        self.workers: list[Worker] = []
        self.dead: list[Worker] = []
        self.spawned = 0
        for _ in range(2):
            self._spawn()
        self.accepted: dict[str, str] = {}  # task id -> record
        self.order: dict[str, list[str]] = {}  # chat -> accepted task ids in dispatch order
        self.ended: dict[str, list[str]] = {}  # chat -> task ids whose finish answered 'ok', in that order
        self.faults = True

    # -- helpers -------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(time.time() * 1000) + self.offset_ms

    def _spawn(self) -> Worker:
        self.spawned += 1
        worker = Worker(f"model-{self.run_id}:{self.spawned}")
        self.workers.append(worker)
        self._beat(worker)
        return worker

    def _beat(self, worker: Worker) -> None:
        """What a live worker's lease thread does each beat (lanes.leases.LeaseBook.beat), on the model's clock."""
        now = self.now_ms()
        pipe = self.rc.pipeline(transaction=False)
        pipe.zadd(keys.PROCS, {worker.proc: now + int(leases.LIVENESS_TTL_S * 1000)})
        if worker.running:
            pipe.zadd(keys.LEASES, dict.fromkeys(worker.running, now + LEASE_MS), xx=True)
        pipe.execute()

    def _beat_all(self) -> None:
        for worker in self.workers:
            self._beat(worker)

    def _ack(self, worker: Worker, index: int) -> tuple[str, bytes]:
        record, msg = worker.in_hand.pop(index)
        self.rc.srem(keys.process_in_hand(worker.proc), record)
        return record, msg

    def _settle(self, records: list[str]) -> None:
        if records:
            forget(records)

    def _release(self, worker: Worker, record: str) -> None:
        worker.running.pop(record, None)
        self.rc.srem(keys.process_held(worker.proc), record)

    def _finish(self, worker: Worker, record: str, outcome: str, owner: str | None = None) -> Finished:
        now = self.now_ms() / 1000
        chat = _chat_of(record)
        reply = lua_finish(task_id=_task_id(record), record=record, chat=chat, outcome=outcome, result_json="null",
                           now=now, tombstone_ttl_s=3600, queued_lease_ms=QUEUED_MS, metric_field="m|m", reason="",
                           execution_latency_bucket="", execution_latency_s=0.0,
                           owner=worker.owner if owner is None else owner, settle_lease_ms=LEASE_MS)
        if reply.status == "ok":
            self.ended.setdefault(chat, []).append(_task_id(record))
        return reply

    def _claim(self, worker: Worker, record: str, msg: bytes) -> Started:
        attempt = int(re.search(rb'"attempt":(\d+)', msg).group(1))  # type: ignore[union-attr]
        return lua_start(task_id=_task_id(record), record=record, chat=_chat_of(record), attempt=attempt,
                         owner=worker.owner, now=self.now_ms() / 1000, lease_ms=LEASE_MS, max_deliveries=10,
                         dead_owner="", metric_field="m|m", queue_latency_bucket="", queue_latency_s=0.0,
                         process=worker.proc, liveness_ms=0)

    def _deliver(self, worker: Worker, index: int) -> None:
        """A worker's delivery of a popped message: claim, and what the worker does with each answer."""
        record, msg = worker.in_hand[index]
        reply = self._claim(worker, record, msg)
        status = reply.status
        self._ack(worker, index)
        if status == "run":
            worker.running[record] = int(re.search(rb'"attempt":(\d+)', msg).group(1))  # type: ignore
        elif status == "finished":
            self._settle([record])  # the result row re-stored: settled
        elif status == "poison":
            self._finish(worker, record, "dead", owner="")
            self._settle([record])

    # -- dispatch ------------------------------------------------------------------------------------
    @rule(kind=st.sampled_from(["plain", "chat", "chat", "limited", "later"]), chat=st.sampled_from(CHATS),
          later_s=st.sampled_from([0.5, 2.0]))
    def dispatch(self, kind: str, chat: str, later_s: float) -> None:
        chat_id = f"{self.run_id}-{chat}"
        if kind == "later":
            result = admit(World.types["chat"], {}, chat_id=chat_id, countdown=later_s)
        elif kind == "chat":
            result = admit(World.types["chat"], {}, chat_id=chat_id)
        else:
            result = admit(World.types[kind], {})
            chat_id = ""
        assert result.accepted, result
        self.accepted[result.task_id] = keys.task_record(result.task_id, chat_id or None)
        if chat_id:
            self.order.setdefault(chat_id, []).append(result.task_id)

    # -- workers -------------------------------------------------------------------------------------
    @rule(w=st.integers(0, 1), room=st.integers(1, 3))
    def pop(self, w: int, room: int) -> None:
        worker = self.workers[w]
        with as_process(worker.proc):
            popped = pop_more(self.rc, self.lane, self.lists, room)
        worker.in_hand.extend((p.record, p.message) for p in popped if p.record)

    @rule(w=st.integers(0, 1), i=st.integers(0, 5))
    def claim(self, w: int, i: int) -> None:
        worker = self.workers[w]
        if worker.in_hand:
            self._deliver(worker, i % len(worker.in_hand))

    @rule(w=st.integers(0, 1), i=st.integers(0, 5), outcome=st.sampled_from(["done", "done", "dead"]))
    def finish(self, w: int, i: int, outcome: str) -> None:
        worker = self.workers[w]
        if not worker.running:
            return
        record = sorted(worker.running)[i % len(worker.running)]
        reply = self._finish(worker, record, outcome)
        self._release(worker, record)
        if reply.status == "ok":
            self._settle([record])

    @rule(w=st.integers(0, 1), i=st.integers(0, 5))
    def retry(self, w: int, i: int) -> None:
        worker = self.workers[w]
        if not worker.running:
            return
        record = sorted(worker.running)[i % len(worker.running)]
        attempt = worker.running[record]
        msg = self.rc.hget(record, "msg") or b""
        next_msg = re.sub(rb'"attempt":\d+', b'"attempt":%d' % (attempt + 1), msg, count=1)
        now = self.now_ms() / 1000
        reply = lua_retry(record=record, lane=self.lane, now=now, next_attempt=attempt + 1, message=next_msg,
                          due=now + 0.1, queued_lease_ms=QUEUED_MS, metric_field="m|m", owner=worker.owner)
        if reply.status == "cancelled":
            self._finish(worker, record, "cancelled")
            self._settle([record])
        self._release(worker, record)

    @rule(pick=st.integers(0, 10_000))
    def cancel(self, pick: int) -> None:
        if not self.accepted:
            return
        task_id = sorted(self.accepted)[pick % len(self.accepted)]
        record = self.accepted[task_id]
        found = lua_cancel(now=self.now_ms() / 1000, detail="model", detail_json='"model"', tombstone_ttl_s=3600,
                           settle_lease_ms=LEASE_MS, queued_lease_ms=QUEUED_MS, targets=[(task_id, record)])
        if found and found[0].outcome == "cancelled":
            self._settle([record])  # the REVOKED row stored

    # -- maintenance ---------------------------------------------------------------------------------
    @rule(step=st.sampled_from(["sweep", "reclaim", "audit", "expire", "promote", "limits"]))
    def maintain(self, step: str) -> None:
        self._beat_all()
        self._maintain(step)

    def _maintain(self, step: str) -> None:
        now = self.now_ms()
        if step == "sweep":
            sweep(now_ms=now, batch=1000, queued_lease_ms=QUEUED_MS)
        elif step == "reclaim":
            reclaim(now_ms=now, max_processes=50, queued_lease_ms=QUEUED_MS)
        elif step == "audit":
            self.rc.delete(keys.CHAT_AUDIT_CURSOR, keys.PARKED_AUDIT_CURSOR)
            for _ in range(1000):  # every chat and every parked lease
                audit_chats(batch=100_000, now_ms=now)
                if not int(self.rc.get(keys.PARKED_AUDIT_CURSOR) or 0):
                    break
        elif step == "expire":
            expire_due()
        elif step == "promote":
            promote(lane=self.lane, now_ms=now, batch=1000, queued_lease_ms=QUEUED_MS)
        else:
            drain_due(now_ms=now, batch=1000, queued_lease_ms=QUEUED_MS)

    @rule(ms=st.sampled_from([1000, LEASE_MS + 1, QUEUED_MS + 1, HELD_MS + 1]))
    def time_passes(self, ms: int) -> None:
        """Leases run out (and attempts overrun: a running task's worker beats only when a rule beats it)."""
        self.offset_ms += ms

    # -- faults --------------------------------------------------------------------------------------
    @precondition(lambda self: self.faults)
    @rule()
    def redis_restarts_from_its_aof(self) -> None:
        """Redis killed (SIGKILL) and started again from its AOF. It fsyncs every write before it answers
        (``appendfsync always``), so it comes back holding everything it answered; every connection
        drops and its scripts are gone (each wrapper's next call meets NOSCRIPT and sends the script).
        The session's Redis is really restarted ``REAL_RESTARTS`` times a run (each loads the whole
        session's AOF: seconds); the other times the same three effects are made without the wait."""
        if LivenessModel.real_restarts < REAL_RESTARTS:
            LivenessModel.real_restarts += 1
            from tests.conftest import _state

            server = _state["redis"]
            server.stop(kill=True)
            server.start()
        else:
            self.rc.script_flush()
            self.rc.client_kill_filter(_type="normal", skipme=True)
        self.rc.connection_pool.disconnect()
        self._beat_all()


    @precondition(lambda self: self.faults)
    @rule(w=st.integers(0, 1))
    def worker_dies(self, w: int) -> None:
        """Killed holding whatever it popped and claimed: its beat stops, a new worker takes its place."""
        self.dead.append(self.workers.pop(w))
        self._spawn()

    @precondition(lambda self: self.faults)
    @rule(w=st.integers(0, 1), i=st.integers(0, 5), ran=st.booleans())
    def claim_unanswered(self, w: int, i: int, ran: bool) -> None:
        """The claim met Redis away: sent and run with its reply lost (``ran``), or never sent; the task
        raised and its message was acked, as Celery acks a failed task."""
        worker = self.workers[w]
        if not worker.in_hand:
            return
        index = i % len(worker.in_hand)
        record, msg = worker.in_hand[index]
        if ran:
            self._claim(worker, record, msg)  # the reply dropped
        self._ack(worker, index)

    @precondition(lambda self: self.faults)
    @rule(w=st.integers(0, 1), room=st.integers(1, 3))
    def pop_unanswered(self, w: int, room: int) -> None:
        """The pop ran and its reply was lost: the worker never saw the messages, which its in-hand set
        names while it lives on."""
        with as_process(self.workers[w].proc):
            pop_more(self.rc, self.lane, self.lists, room)

    @precondition(lambda self: self.faults)
    @rule(w=st.integers(0, 1), i=st.integers(0, 5))
    def finish_unanswered(self, w: int, i: int) -> None:
        """The finish ran and its reply was lost: the worker gives the task up unsettled (its record is
        left to its lease: the sweep republishes it, and that copy re-stores the result)."""
        worker = self.workers[w]
        if not worker.running:
            return
        record = sorted(worker.running)[i % len(worker.running)]
        self._finish(worker, record, "done")
        worker.running.pop(record)

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def chats_keep_their_order_and_one_in_flight(self) -> None:
        pipe = self.rc.pipeline(transaction=False)
        for chat in self.order:
            pipe.lrange(keys.chat_queue(chat), 0, -1)
        queues = dict(zip(self.order, pipe.execute(), strict=True))
        states = self._states()
        for chat, ids in self.order.items():
            waiting = [t for t in ids if states[t] not in FINISHED and states[t] is not None]
            queue = [t.decode() for t in queues[chat]]
            assert queue == waiting, f"chat {chat}: queue {queue} != unfinished in dispatch order {waiting}"
            running = [t for t in ids if states[t] == "running"]
            assert running in ([], queue[:1]), f"chat {chat}: running {running}, head {queue[:1]}"
            ended = self.ended.get(chat, [])
            assert len(set(ended)) == len(ended), f"chat {chat}: a task finished twice: {ended}"
            assert ended == [t for t in ids if t in set(ended)], f"chat {chat}: finished out of order: {ended}"

    @invariant()
    def every_task_is_in_the_one_place_its_state_names(self) -> None:
        states = self._states()
        delayed = {m.decode() for m in self.rc.zrange(keys.lane_delayed(self.lane), 0, -1)}
        for task_id, record in self.accepted.items():
            st_ = states[task_id]
            if st_ is None:
                assert self.rc.exists(keys.tombstone(task_id)), f"{task_id}: no record and no tombstone: lost"
                continue
            assert st_ in STATES, f"{task_id}: unknown state {st_}"
            if st_ == "retry":
                assert record in delayed, f"{task_id}: parked for a retry but not in the delayed set"
            elif st_ != "scheduled":
                assert record not in delayed, f"{task_id}: {st_} and in the delayed set"
            if st_ == "limited":
                base = (self.rc.hget(record, "lw") or b"").decode()
                assert self.rc.zscore(keys.limit_waiting(base), record) is not None, f"{task_id}: limited, not waiting"

    def _states(self) -> dict[str, str | None]:
        pipe = self.rc.pipeline(transaction=False)
        for record in self.accepted.values():
            pipe.hget(record, "st")
        return {t: (s.decode() if s else None) for t, s in zip(self.accepted, pipe.execute(), strict=True)}

    # -- liveness --------------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Faults stop; maintenance runs for a lease and a sweep each round, and a healthy worker takes
        what is published: within ``ROUNDS`` every accepted task has finished or is dead."""
        self.faults = False
        # The live workers end what they hold (an attempt that never ended is the attempt limits' business).
        for worker in self.workers:
            while worker.in_hand:
                self._deliver(worker, 0)
            self._finish_all(worker)
        healthy = self.workers[0]
        for _ in range(ROUNDS):
            if self._all_finished():
                return
            self.offset_ms += max(LEASE_MS, QUEUED_MS) + 1000
            self._beat_all()
            for step in ("promote", "limits", "reclaim", "sweep", "audit"):
                self._maintain(step)
            self.offset_ms += HELD_MS + 1000
            self._beat_all()
            self._maintain("audit")
            self._maintain("promote")
            for _ in range(200):
                with as_process(healthy.proc):
                    popped = pop_more(self.rc, self.lane, self.lists, 10)
                if not popped:
                    break
                healthy.in_hand.extend((p.record, p.message) for p in popped if p.record)
                while healthy.in_hand:
                    self._deliver(healthy, 0)
                self._finish_all(healthy)
                self._maintain("promote")
                self._maintain("limits")
        left = {t: s for t, s in self._states().items() if s is not None and s not in FINISHED}
        assert not left, f"not finished after {ROUNDS} rounds of maintenance and a healthy worker: {left}; " \
            f"{self._describe(left)}"

    def _describe(self, left: dict[str, str | None]) -> dict:
        """What Redis holds for the tasks left (and the limit slots' holders), for the failure message."""
        def fields(record: str) -> dict:
            return {k.decode(): v.decode(errors="replace") for k, v in self.rc.hgetall(record).items() if k != b"msg"}

        out: dict = {t: {**fields(self.accepted[t]), "lease": self.rc.zscore(keys.LEASES, self.accepted[t])}
                     for t in left}
        for base in {out[t].get("lw", "") for t in out} - {""}:
            out[f"holders of {base}"] = {m.decode(): fields(m.decode()) for m in self.rc.smembers(base + ":f")}
        return out

    def _finish_all(self, worker: Worker) -> None:
        for record in sorted(worker.running):
            if self._finish(worker, record, "done").status == "ok":
                self._settle([record])
            self._release(worker, record)

    def _all_finished(self) -> bool:
        return all(s is None or s in FINISHED for s in self._states().values())


LivenessModel.TestCase.settings = hsettings(bounded(25), stateful_step_count=30)
test_liveness_model = LivenessModel.TestCase


@pytest.fixture
def mutant_scripts(tmp_path: Path):
    """Every script loaded from a copy of lanes/lua whose _lib.lua holds the broken hand_over."""
    folder = tmp_path / "lua"
    shutil.copytree(loader.SCRIPT_DIR, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    lib = (folder / "_lib.lua").read_text()
    assert lib.count(MUTANT[0]) == 1
    (folder / "_lib.lua").write_text(lib.replace(*MUTANT))
    with mock.patch.object(loader, "SCRIPT_DIR", folder):
        loader._source.cache_clear()
        loader._scripts.clear()
        yield
    loader._source.cache_clear()
    loader._scripts.clear()


def test_a_broken_hand_over_is_caught(mutant_scripts):
    settings_ = hsettings(bounded(40), stateful_step_count=30, phases=[Phase.generate], derandomize=True,
                          print_blob=False)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(LivenessModel, settings=settings_)

