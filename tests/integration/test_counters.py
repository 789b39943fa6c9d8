"""``lanes.counters``: the hot path's counts, kept in process and written to Redis in batches (issue 16)."""

from __future__ import annotations

import os

import redis

from lanes import counters, keys
from tests.support.helpers import unique


def test_a_flush_writes_each_field_once_in_the_layout_the_readers_read(rc):
    field, now = unique("started|ln|ty"), 1_800_000_000.0
    counters.flush()
    for _ in range(50):
        counters.add(field, now)
    counters.observe("qlat", "ln|" + field, "0.1", 0.25, now)
    counters.add("busy|" + field, now, 1.5, counters.MINUTE)
    counters.flush()  # four (minute, field) entries: six commands and an EXPIRE, not 150 (or the thread did)
    minute = keys.metrics_minute(int(now // 60))
    assert int(rc.hget(keys.METRICS_TOTAL, field)) == 50 and int(rc.hget(minute, field)) == 50
    assert float(rc.hget(keys.METRICS_TOTAL, f"qlat_sum|ln|{field}")) == 0.25
    assert rc.hget(minute, f"qlat_sum|ln|{field}") is None  # sums: all-time hash only, as the scripts did
    assert float(rc.hget(minute, "busy|" + field)) == 1.5 and rc.hget(keys.METRICS_TOTAL, "busy|" + field) is None
    assert 0 < rc.ttl(minute) <= counters.MINUTE_TTL_S
    assert counters.pending() == 0


def test_counts_survive_a_redis_that_does_not_answer(rc):
    field = unique("dispatched|ln|ty")
    counters.add(field, 1_800_000_000.0, 3)
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    assert counters.flush(dead) == 0  # kept for the next flush (this one, or the thread's)
    counters.flush()
    assert int(rc.hget(keys.METRICS_TOTAL, field)) == 3


def test_a_forked_child_does_not_write_its_parents_counts_again(rc):
    counters.add(unique("started|ln|ty"), 1_800_000_000.0)
    pid = os.fork()
    if pid == 0:  # the child: the parent's counts are the parent's to write
        os._exit(0 if counters.pending() == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    counters.flush()
