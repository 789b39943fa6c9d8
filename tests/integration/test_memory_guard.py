"""Admission refuses new work before Redis reaches its maxmemory, and what it accepted still drains.

The session's Redis is given a small ``maxmemory`` (``noeviction``) for the test
and its own again after.
"""

from __future__ import annotations

from django.conf import settings

from lanes import memory_guard
from tests.support.helpers import define, lane_depth, unique, wait_until

#: Room above what Redis holds when the test starts, up to the guard's limit.
HEADROOM = 1_500_000
#: The guard's share of maxmemory here. At a few MB the rest must hold what a starting worker
#: writes beside its tasks (its connections' buffers, the script cache, heartbeats): a share of
#: a production maxmemory (0.9 of a GB) leaves a hundred MB for that; 0.9 of 3 MB does not.
HIGH = 0.4


def _ran(sink) -> dict[str, int]:
    counts: dict[str, int] = {}
    with sink.sink.lock:
        for attempt in sink.sink.attempts:
            if attempt.status == 200:
                task_id = attempt.headers.get("X-Dispatch-Task-Id", "")
                counts[task_id] = counts.get(task_id, 0) + 1
    return counts


def test_a_flood_is_refused_before_maxmemory_and_every_accepted_task_drains_once(rc, sink, start_worker,
                                                                                   monkeypatch):
    from tasks.dispatch import dispatch, dispatch_many

    name, lane = unique("memguard"), unique("l-memguard")
    define(name, handler="http.post", lane=lane, options={"url": sink.url})
    before = rc.config_get("maxmemory")["maxmemory"], rc.config_get("maxmemory-policy")["maxmemory-policy"]
    used = int(rc.info("memory")["used_memory"])
    monkeypatch.setattr(settings, "DISPATCH_MEMORY_HIGH", HIGH)
    maxmemory = int((used + HEADROOM) / HIGH)
    accepted: list[str] = []
    refused = None
    try:
        rc.config_set("maxmemory-policy", "noeviction")
        rc.config_set("maxmemory", maxmemory)
        memory_guard.forget()
        padding = "x" * 400
        for i in range(5000):
            result = dispatch.delay(name, {"n": i, "pad": padding})
            if not result.accepted:
                refused = result
                break
            accepted.append(result.task_id)
        assert refused is not None, "5,000 tasks fitted: the maxmemory was not small"
        assert refused.reason == "redis_memory_high", refused.detail
        assert "maxmemory" in refused.detail
        assert 100 < len(accepted)
        assert int(rc.info("memory")["used_memory"]) < maxmemory  # Redis itself never refused a write
        bulk = dispatch_many(name, [{"n": i} for i in range(50)])
        assert {r.reason for r in bulk} == {"redis_memory_high"}

        # Still under the same maxmemory: every accepted task claims, runs and finishes.
        start_worker(lane, pool="threads", concurrency=4)
        wait_until(lambda: set(_ran(sink)) >= set(accepted), timeout=90, interval=0.2,
                   what="the accepted tasks ran")
        wait_until(lambda: lane_depth(rc, lane) == 0, timeout=20, what="the lane drained")
        ran = _ran(sink)
        assert set(ran) == set(accepted) and all(n == 1 for n in ran.values())
    finally:
        rc.config_set("maxmemory", before[0])
        rc.config_set("maxmemory-policy", before[1])
        memory_guard.forget()
