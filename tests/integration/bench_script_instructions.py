"""Measurement (not part of ``make test``): instructions inside Redis per real call of admit.lua, pop_more.lua,
claim_group.lua and finish_batch.lua, one plain task at a time through each step (``N`` tasks a step).

Run with Redis under callgrind, collecting inside EVALSHA/EVAL only (counts, which load does not move):
``DISPATCH_REDIS_SERVER=scripts/valkey_callgrind.sh .venv/bin/python -m pytest -q -s
tests/integration/bench_script_instructions.py``. Prints Ir per script call (the Redis commands' work
inside a script included; a background call of the test process, such as a beat, may add one call).
Nothing here asserts a count.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import time

from lanes import keys
from lanes.lua.claim_group import FinishTerms, GroupItem, claim_group
from lanes.lua.finish_batch import DoneItem, Latencies, finish_batch
from lanes.lua.pop_more import pop_more
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique

N = int(os.environ.get("BENCH_TASKS", "200"))
OUT = os.environ.get("CALLGRIND_OUT", "/tmp/callgrind-valkey")
PROCESS = "bench-instructions:1"
TERMS = {"lease_ms": 30_000, "max_deliveries": 5, "process": PROCESS, "liveness_ms": 5_000}
FINISH = FinishTerms(tombstone_ttl_s=60, queued_lease_ms=120_000, settle_lease_ms=10_000)


def _evalshas(rc) -> int:
    stats = rc.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))


def _measure(rc, pid, what, run):
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    calls = _evalshas(rc)
    run()
    calls = _evalshas(rc) - calls
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    newest = max(glob.glob(f"{OUT}/cg.{pid}.*"), key=os.path.getmtime)
    total = int(re.search(r"^(?:summary|totals): (\d+)", open(newest).read(), re.M).group(1))
    print(f"{what:13} {total / max(calls, 1):9,.0f} Ir/call  ({calls} script calls for {N} tasks)"
          f"  load {os.getloadavg()[0]:.2f}", flush=True)


def test_bench(rc, redis_server):
    pid = redis_server.proc.pid
    lane, type_name = unique("bi"), unique("bi-echo")
    define(type_name, lane=lane)
    dispatch.delay(type_name, {"warm": 1})
    for p in pop_more(rc, lane, keys.lane_queues(lane), 1):
        rc.delete(p.record)
    ids = []
    _measure(rc, pid, "admit", lambda: ids.extend(dispatch.delay(type_name, {"n": n}).task_id for n in range(N)))
    popped = []
    _measure(rc, pid, "pop_more", lambda: [popped.extend(pop_more(rc, lane, keys.lane_queues(lane), 1))
                                           for _ in range(N)])
    assert len(popped) == N

    def claim():
        for i, p in enumerate(popped):
            task_id = p.tag.rsplit(".", 1)[0]
            got = claim_group(items=[GroupItem(task_id, p.record, 1, f"{PROCESS}:g{i}", "")], now=time.time(),
                              counts=[("x|y", "", 0.0)], done=[], finish=FINISH, **TERMS)
            assert [c.status for c in got.claims] == ["run"], got

    _measure(rc, pid, "claim_group", claim)
    lat = Latencies({}, 0.0)

    def finish():
        for i, p in enumerate(popped):
            task_id = p.tag.rsplit(".", 1)[0]
            got = finish_batch(items=[DoneItem(task_id, p.record, "", '"r"', f"{PROCESS}:g{i}", "1")], now=time.time(),
                               tombstone_ttl_s=60, queued_lease_ms=120_000, settle_lease_ms=10_000,
                               metric_field="x|y", execution=lat, busy_s=0.0, queue=lat, counted=False)
            assert got == ["ok"], got

    _measure(rc, pid, "finish_batch", finish)
