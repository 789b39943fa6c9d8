"""A chat id holding any printable character pops with its record named in the in-hand set.

The record key sits in the message's headers as a JSON string, so a chat id with
'"' or '\\' is escaped there; pop_more.lua read it with a pattern that stopped at the
first backslash and named nothing, and recovery of that message fell back to the
queued lease.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lanes import keys, leases
from lanes.lua.pop_more import pop_more
from tasks.cancel import cancel_task
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique
from tests.support.hypothesis_profile import bounded
from tests.support.redis_server import RedisServer

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
TYPE = unique("quoted-chat")
LANE = unique("quoted")


@pytest.fixture(scope="module")
def chat_type(redis_server):
    define(TYPE, lane=LANE, chat_scoped=True)
    return TYPE


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """A Redis of its own for the pops, so that its command counts are the pop's alone."""
    server = RedisServer(tmp_path_factory.mktemp("quiet"), "quiet").start()
    yield server.client()
    server.stop()


def _commands(client) -> dict[str, int]:
    return {name: stats["calls"] for name, stats in client.info("commandstats").items()}


def _pop_and_check(rc, quiet, chat_id: str) -> dict[str, int]:
    """Admit a task of ``chat_id`` (the session's Redis), pop its message as admission wrote it (the
    quiet Redis), and return the commands the pop cost."""
    result = dispatch.delay(TYPE, {"x": 1}, chat_id=chat_id)
    assert result.accepted, result
    record = keys.task_record(result.task_id, chat_id)
    lists = keys.lane_queues(LANE)
    [message] = [m for name in lists for m in rc.lrange(name, 0, -1)]
    quiet.flushall()
    quiet.hset(record, mapping=rc.hgetall(record))  # the list names the record: the pop reads it
    quiet.lpush(lists[0], message)
    in_hand = keys.process_in_hand(leases.process_id())
    quiet.config_resetstat()
    popped = pop_more(quiet, LANE, lists, 4)
    cost = {name: n for name, n in _commands(quiet).items() if name != "cmdstat_info"}
    assert [p.record for p in popped] == [record]
    assert quiet.smembers(in_hand) == {record.encode()}
    # Cancelled (it never started), so the next example's chat starts empty.
    assert cancel_task(result.task_id, "test over", chat_id=chat_id).outcome == "cancelled"
    return cost


def test_every_printable_character_alone_in_a_chat_id(rc, chat_type, quiet):
    _pop_and_check(rc, quiet, "plain-chat")  # the script loaded once
    plain = _pop_and_check(rc, quiet, "plain-chat")
    for char in PRINTABLE:
        # Quoted or not, the pop costs the same commands as a plain chat's.
        assert _pop_and_check(rc, quiet, f"c{char}{char}\\{char}") == plain, repr(char)


@settings(bounded(60), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chat_id=st.text(alphabet=PRINTABLE, min_size=1, max_size=40))
@example(chat_id='"')
@example(chat_id="\\")
@example(chat_id='a\\"b"\\\\')
def test_any_printable_chat_id_pops_with_its_record_in_hand(rc, chat_type, quiet, chat_id):
    _pop_and_check(rc, quiet, chat_id)

