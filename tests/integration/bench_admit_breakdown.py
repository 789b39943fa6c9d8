"""Measurement (not part of ``make test``): where a plain ``dispatch.delay``'s admit.lua call spends its
instructions inside Redis, by variants of the script run with one real call's KEYS and ARGV.

Run with Redis under callgrind (``scripts/valkey_callgrind.sh``, counting inside EVALSHA/EVAL only):
``DISPATCH_REDIS_SERVER=scripts/valkey_callgrind.sh .venv/bin/python -m pytest -q -s
tests/integration/bench_admit_breakdown.py``. Each variant runs ``N`` calls, each with a fresh task id
(a new record, as a dispatch makes), onto a backlog, with no live consumer (the estimate's two reads each
call, as in ``bench_script_instructions``) unless ``BENCH_CONSUMER=1``
(or none read: ``BENCH_READ_ESTIMATE=0``). Prints Ir a call per variant;
asserts no count. ``BENCH_VARIANTS``: a comma-separated subset. The ``fcall`` variant (the script as a Redis
Functions library, a probe) is counted only when the server's callgrind also collects in ``fcallCommand``
(``--toggle-collect=fcallCommand``); else it prints 0.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import subprocess
import time

from lanes import keys
from lanes.lua import admit
from lanes.lua.loader import _source
from tasks.dispatch import dispatch
from tests.support.admit_reference import keys_and_args
from tests.support.helpers import define, unique

N = int(os.environ.get("BENCH_TASKS", "200"))
#: ``BENCH_READ_ESTIMATE=0``: calls sent with the estimate inputs cached (a serving lane's, all but one a second).
READ_ESTIMATE = os.environ.get("BENCH_READ_ESTIMATE", "1") == "1"
OUT = os.environ.get("CALLGRIND_OUT", "/tmp/callgrind-valkey")
BODY_START = "local version = redis.call('GET', c.config_version)"


def _variants(source: str) -> dict[str, str]:
    """Script texts, each the real one cut somewhere (the cost of what was cut is the difference)."""
    assert BODY_START in source
    head, body = source.split(BODY_START, 1)
    waiting = keys.LANE_WAITING_SUFFIX
    # The plain item's commands alone, their arguments taken straight from KEYS/ARGV (the item's priority list is
    # KEYS[12 + its priority]; the item's record KEYS[22]; its ARGV from 19): the floor for these commands.
    commands = f"""
local r, q, now = KEYS[22], KEYS[12 + tonumber(ARGV[21])], ARGV[2]
redis.call('GET', KEYS[1])
local depth = redis.call('INCR', ARGV[12] .. ARGV[3] .. '{waiting}') - 1
redis.call('HSET', r, 'msg', ARGV[20], 'q', q, 'lane', ARGV[3], 'type', ARGV[4], 'st', 'queued', 'att', '1',
  'dlv', '0', 'chat', '', 'pub', '1', 'dl', ARGV[24], 'own', '')
redis.call('ZADD', KEYS[9], ARGV[24], r)
redis.call('LPUSH', q, r .. '#1')
redis.call('ZADD', KEYS[2], tonumber(now) + tonumber(ARGV[9]), r)
local paused = redis.call('SISMEMBER', KEYS[10], ARGV[3])
local consumers = redis.call('ZCOUNT', KEYS[11], now, '+inf')
return {{{{'0', '0', '0', '0', paused, consumers}}, depth}}
"""
    return {
        "real": source,
        "empty": "return 1",
        "empty_noargs": "return 1",
        "defs_only": head + "do return {{}} end\n" + BODY_START + body,
        "commands_only": commands,
        "fcall": _as_function(source),
    }


def _as_function(source: str) -> str:
    """The script as a Redis Functions library (a probe of what ``FCALL`` would cost, never loaded by the
    platform): its top level runs once, at ``FUNCTION LOAD``; a call runs only what builds ``c`` and the body."""
    head, body = source.split(BODY_START, 1)
    found = re.search(r"^local c = \{\n.*?^local items = [^\n]*\n", head, re.M | re.S)
    assert found, "admit.lua's named KEYS/ARGV moved: update this probe"
    head = head.replace(found[0], "")
    return ("#!lua name=admit_probe\nlocal KEYS, ARGV = nil, nil\n" + head
            + "redis.register_function('admit_probe', function(keys, args)\nKEYS, ARGV = keys, args\n"
            + found[0] + BODY_START + body + "\nend)\n")


def _measure(rc, pid: int, sha: str, calls: list[tuple[list, list]]) -> tuple[float, str]:
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    for k, a in calls:
        if sha == "fcall":
            rc.fcall("admit_probe", len(k), *k, *a)
        else:
            rc.evalsha(sha, len(k), *k, *a)
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    newest = max(glob.glob(f"{OUT}/cg.{pid}.*"), key=os.path.getmtime)
    total = int(re.search(r"^(?:summary|totals): (\d+)", open(newest).read(), re.M).group(1))
    return total / len(calls), newest


def test_breakdown(rc, redis_server):
    pid = redis_server.proc.pid
    lane, type_name = unique("ab"), unique("ab-echo")
    define(type_name, lane=lane)
    seen: list[tuple[admit.Chunk, list[admit.Item]]] = []
    send = admit.Calls.send

    def spy(self, chunk, items):
        seen.append((chunk, list(items)))
        return send(self, chunk, items)

    admit.Calls.send = spy
    try:
        dispatch.delay(type_name, {"n": 0})
    finally:
        admit.Calls.send = send
    chunk, (item,) = seen[-1]
    if os.environ.get("BENCH_CONSUMER") == "1":
        rc.zadd(keys.lane_consumers(lane), {"bench": int(time.time() * 1000) + 3_600_000})
    wanted = [v for v in os.environ.get("BENCH_VARIANTS", "").split(",") if v]
    variants = _variants(_source(admit.NAME))
    # A backlog first: the shared sorted sets (deadlines, leases) past their compact encoding, as a lane
    # with work waiting has them (200 calls into fresh sets measure listpack inserts instead).
    sha = rc.script_load(variants["real"])
    for n in range(300):
        k, a = keys_and_args(chunk, [dataclasses.replace(item, task_id=f"{item.task_id}-warm-{n}")])
        rc.evalsha(sha, len(k), *k, *a)
    for name, text in variants.items():
        if wanted and name not in wanted:
            continue
        if name == "fcall":
            rc.function_load(text, replace=True)
            sha = "fcall"
        else:
            sha = rc.script_load(text)
        calls = [keys_and_args(chunk, [dataclasses.replace(item, task_id=f"{item.task_id}-{name}-{n}")],
                               read_estimate=READ_ESTIMATE) for n in range(N)]
        if name == "empty_noargs":
            calls = [([], [])] * N
        per_call, dump = _measure(rc, pid, sha, calls)
        print(f"{name:14} {per_call:9,.0f} Ir/call  ({N} calls)  load {os.getloadavg()[0]:.2f}  {dump}", flush=True)
