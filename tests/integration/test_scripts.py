"""``lanes.lua.loader.call`` and the wrappers: the lean script call used on every task's start and finish."""

from __future__ import annotations

import pytest
import redis

from lanes import keys
from lanes.lua import loader as scripts
from lanes.lua.start import Started, start
from lanes.redis_client import get_redis
from tests.support.helpers import unique


def _start_args(task_id: str) -> tuple[list, list]:
    record = keys.task_record(task_id)
    return ([record, keys.LEASES, keys.CONFIG_VERSION, record, keys.tombstone(task_id)],
            [task_id, 1, "host:1:2", 1000, 30000, 5, ""])


def test_call_answers_like_the_registered_script():
    task_id = unique("sc")
    k, a = _start_args(task_id)
    assert scripts.call("start", k, a) == scripts.script("start")(keys=k, args=a) == [b"gone"]
    get_redis().set(keys.tombstone(task_id), 'done|{"x": 1}')
    assert scripts.call("start", k, a) == [b"finished", b'done|{"x": 1}']


def test_call_loads_the_script_again_after_redis_lost_it(rc):
    k, a = _start_args(unique("sc"))
    sha = scripts.script("start").sha
    rc.script_flush()
    assert rc.script_exists(sha) == [False]
    assert scripts.call("start", k, a) == [b"gone"]
    assert rc.script_exists(sha) == [True]


def test_a_script_error_is_raised_and_the_connection_stays_usable(rc):
    task_id = unique("sc")
    k, a = _start_args(task_id)
    rc.set(k[0], "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        scripts.call("start", k, a)
    rc.delete(k[0])
    assert scripts.call("start", k, a) == [b"gone"]
    pool = get_redis().connection_pool
    from lanes.lua import loader  # admission's stream keeps one connection checked out between calls

    kept = set(loader.kept_connections(pool))
    assert not set(pool._in_use_connections) - kept  # every other connection went back to the pool


def test_the_wrapper_sends_what_the_positional_call_sends(rc):
    """``lanes.lua.start.start`` (named values) answers like the call by position it replaced."""
    task_id = unique("sc")
    k, a = _start_args(task_id)
    named = dict(task_id=task_id, record=k[0], chat="", attempt=1, owner="host:1:2", now=1.0, lease_ms=30000,
                 max_deliveries=5, dead_owner="", metric_field="lane|type", queue_latency_bucket="",
                 queue_latency_s=0.0, process="host:1", liveness_ms=5000)
    assert scripts.call("start", [*k, keys.DEADLINES], a) == [b"gone"]
    assert start(**named) == Started("gone")
    rc.set(keys.tombstone(task_id), 'done|{"x": 1}')
    assert start(**named) == Started("finished", 'done|{"x": 1}')
