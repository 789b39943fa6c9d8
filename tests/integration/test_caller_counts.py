"""Each token's count of waiting tasks in a lane (admission's ``caller_quota``) is exact through every path.

A token's tasks (ids ``tk<token id>-``) are counted per (lane, token) beside
the lane's waiting count (``keys.lane_callers``), by the same two functions of
_lib.lua. The truth it stands for is the deadlines set: the token's records
there whose lane is that lane. A seeded random mix of tokens and Python callers
drives every way a task enters or leaves waiting (admission and its
rejections, bulk chunks, chat heads and the messages behind them, sent for
later, a limit, claims and batched claims, retries, dead letters and a
requeue, cancels, expiry, a worker killed mid-task and its tasks reclaimed)
while an atomic snapshot compares count and truth; a lost or corrupted count
is recounted by the maintenance audit.
"""

from __future__ import annotations

import json
import random
import uuid

from lanes import keys
from tasks import maintenance
from tasks.dispatch import admit, dispatch_many
from tests.support.helpers import define, unique, wait_until

#: Count and truth read in one script: Redis runs it alone, so they are compared at one instant.
SNAPSHOT = """
local lanes = cjson.decode(ARGV[1])
local wanted = {}
for _, lane in ipairs(lanes) do wanted[lane] = true end
local truth, counts = {}, {}
for _, record in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local lane = redis.call('HGET', record, 'lane')
  local caller = string.match(record, ':tk(%d+)%-[^:]*$')
  if lane and caller and wanted[lane] then
    truth[lane .. '|' .. caller] = (truth[lane .. '|' .. caller] or 0) + 1
  end
end
for _, lane in ipairs(lanes) do
  local flat = redis.call('HGETALL', ARGV[2] .. lane .. ARGV[3])
  for i = 1, #flat, 2 do
    if flat[i] ~= ARGV[4] then counts[lane .. '|' .. flat[i]] = tonumber(flat[i + 1]) end
  end
end
return cjson.encode({truth, counts})
"""


def snapshot(rc, lanes: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    text = rc.eval(SNAPSHOT, 1, keys.DEADLINES, json.dumps(lanes), keys.LANE_PREFIX, keys.LANE_CALLERS_SUFFIX,
                   keys.LANE_CALLERS_COUNTED)
    truth, counts = json.loads(text)
    return ({} if truth == [] else truth), ({} if counts == [] else counts)  # cjson writes {} as []


def assert_exact(rc, lanes: list[str], when: str) -> dict[str, int]:
    truth, counts = snapshot(rc, lanes)
    assert counts == truth, when
    assert all(n > 0 for n in counts.values()), when  # a count at 0 leaves no field; never below
    return truth


def test_a_random_mix_keeps_every_tokens_count_equal_to_its_waiting_tasks(rc, start_worker):
    from tests.integration.test_limits_scripts import limit, limited_type

    rng = random.Random(2727)
    lane, idle = unique("cc-run"), unique("cc-idle")
    echo, flaky, chat, batch = (unique(f"cc-{n}") for n in ("echo", "flaky", "chat", "batch"))
    late = unique("cc-late")
    define(echo, lane=lane, timeout=600)
    define(flaky, handler="demo.flaky", lane=lane, timeout=120,
           policy={"initial_backoff": 0.05, "max_backoff": 0.2, "jitter": 0, "max_retries": 3})
    define(chat, lane=lane, chat_scoped=True, chat_queue_size=50, timeout=120)
    define(batch, handler="demo.echo_batch", lane=lane, batch_size=5, batch_window_ms=20, timeout=120)
    define(late, lane=idle, timeout=2, attempt_timeout=1)  # no worker takes it: each expires
    limited = limited_type(unique("cc-lim"), [limit(unique("cc-one"), scope="global", max_in_flight=1)], lane,
                           timeout=120).name
    lanes = [lane, idle]
    callers = [f"tk{n}-" for n in rng.sample(range(900_000, 999_999), 3)]

    def new_id() -> str:
        return rng.choice([*callers, ""]) + str(uuid.UUID(int=rng.getrandbits(128), version=4))

    parked: set[str] = set()  # sent for later in 300 s: rightly still waiting at the end

    def one(step: int):
        kind = rng.choice(["echo", "echo", "slow", "flaky", "fatal", "chat", "later", "batch", "limited", "late"])
        task_id = new_id()
        if kind == "echo":
            return admit(echo, {"s": step}, _task_id=task_id)
        if kind == "slow":
            return admit(echo, {"s": step, "sleep": 0.3}, _task_id=task_id)
        if kind == "flaky":
            return admit(flaky, {"fail": "retry", "fail_times": rng.randint(1, 2)}, _task_id=task_id)
        if kind == "fatal":
            return admit(flaky, {"fail": "fatal"}, _task_id=task_id)
        if kind == "chat":
            return admit(chat, {"s": step}, chat_id=f"c{rng.randrange(3)}", _task_id=task_id)
        if kind == "later":
            countdown = rng.choice([0.5, 1.5, 300])
            if countdown == 300:
                parked.add(task_id)
            return admit(echo, {"s": step}, countdown=countdown, _task_id=task_id)
        if kind == "batch":
            return admit(batch, {"s": step}, _task_id=task_id)
        if kind == "limited":
            return admit(limited, {"s": step, "sleep": 0.05}, _task_id=task_id)
        return admit(late, {"s": step}, _task_id=task_id)

    made = [one(step) for step in range(90)]
    made += dispatch_many(echo, [{"bulk": i} for i in range(20)], id_prefix=callers[0])  # one chunk, deferred writes
    assert [r for r in made if not r.accepted] == []
    truth = assert_exact(rc, lanes, "after admission")
    assert sum(truth.values()) > 40 and {k.split("|")[0] for k in truth} == {lane, idle}
    for r in rng.sample(made, 20):  # queued, sent for later, behind a chat's head, on the limit, expiring
        r.cancel("cc")
        parked.discard(r.task_id)
        assert_exact(rc, lanes, f"after cancelling {r.task_id}")

    def record(r) -> str:
        return keys.task_record(r.task_id, r.chat_id or None)

    victim = start_worker(lane, concurrency=2)
    wait_until(lambda: any(rc.hget(record(r), "st") == b"running" for r in made), timeout=30, what="a task running")
    for _ in range(5):  # while the worker runs: the snapshot is atomic, so any moment will do
        assert_exact(rc, lanes, "while running")
    victim.kill()  # its running tasks are reclaimed (waiting again) by the next worker's maintenance
    start_worker(lane, concurrency=2, pool="threads")
    tokens_parked = sum(1 for task_id in parked if task_id.startswith("tk"))

    def quiet() -> bool:
        truth, counts = snapshot(rc, lanes)
        return counts == truth and sum(truth.values()) == tokens_parked

    wait_until(quiet, timeout=90, interval=0.5, what="every task not parked for later finished or expired")
    from tasks.dead_letters import requeue
    from tasks.models import DeadLetter

    dead = DeadLetter.objects.filter(task_id__in=[r.task_id for r in made if r.task_id.startswith("tk")],
                                     reason="non_retryable").first()
    assert dead is not None
    requeued = requeue(dead, "cc-test")
    assert requeued.startswith(dead.task_id.split("-", 1)[0] + "-")
    assert_exact(rc, lanes, "after the requeue")
    wait_until(quiet, timeout=30, interval=0.3, what="the requeued task done")
    assert_exact(rc, lanes, "at the end")


def test_a_lost_or_wrong_count_is_recounted_and_admission_never_counts_below_zero(rc):
    lane = unique("cc-heal")
    name = unique("cc-heal-echo")
    define(name, lane=lane, timeout=300)
    mine = [admit(name, {"i": i}, _task_id=f"tk910001-{uuid.uuid4()}") for i in range(4)]
    theirs = [admit(name, {"i": i}, _task_id=f"tk910002-{uuid.uuid4()}") for i in range(2)]
    assert all(r.accepted for r in mine + theirs)
    key = keys.lane_callers(lane)
    assert_exact(rc, [lane], "before")
    maintenance.audit_waiting_counts()
    assert rc.hget(key, keys.LANE_CALLERS_COUNTED) == b"1"

    rc.delete(key)  # lost: a cancel counts below zero (dropped, never negative), the audit recounts
    mine.pop().cancel("lost")
    assert rc.hget(key, "910001") is None
    audited = maintenance.audit_waiting_counts()
    assert audited.recounted and {(c.caller, c.was, c.now) for c in audited.corrections} >= {
        ("910001", 0, 3), ("910002", 0, 2)}
    assert assert_exact(rc, [lane], "recounted") == {f"{lane}|910001": 3, f"{lane}|910002": 2}

    rc.hset(key, "910002", 40)  # more than the lane holds: recounted too
    assert maintenance.audit_waiting_counts().recounted
    assert_exact(rc, [lane], "recounted again")
    assert not maintenance.audit_waiting_counts().recounted  # a sound count is only checked
    for r in mine + theirs:
        r.cancel("done")
    assert rc.hgetall(key) == {keys.LANE_CALLERS_COUNTED.encode(): b"1"}
