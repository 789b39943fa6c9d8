"""What a test module leaves behind for the modules after it: waiting tasks in the session's Redis, and
child processes still running. ``tests/conftest.py`` settles the one and fails on the other at each
module's end.

Waiting tasks: a test that admits tasks onto a lane no worker will serve again (a flood it measured
part of, property examples, a worker killed at the test's end) leaves them in the deadlines set. The
first worker of a later module runs the maintenance loop over every lane and expires them when their
deadline comes: hundreds of Lua calls and dead-letter rows inside that module's own window. A
module that counts Redis commands then counts them too (test_redis_budget failed so in a whole
suite: 393 tasks of test_properties_admission came due 60 s later, during its first run).
``settle_waiting`` cancels them at the end of the module that left them, through cancel.lua (every
count, chat queue and limit they held is undone as for any cancel), and drops their records with
forget.lua. No REVOKED row is written: nobody asks for a test's leftovers.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from lanes import keys
from lanes.lua.cancel import cancel
from lanes.lua.forget import forget

#: Targets per cancel.lua call (tasks.cancel.PURGE_BATCH's size).
BATCH = 200
DETAIL = "left waiting by an earlier test module"


def settle_waiting(client) -> int:
    """Cancel every task waiting in ``client``'s Redis and drop its record; returns how many."""
    from django.conf import settings

    from tasks.execution import tombstone_ttl_s

    records = [m.decode() for m in client.zrange(keys.DEADLINES, 0, -1)]
    settled = 0
    for first in range(0, len(records), BATCH):
        chunk = records[first:first + BATCH]
        answers = cancel(
            now=time.time(), detail=DETAIL, detail_json=json.dumps(DETAIL), tombstone_ttl_s=tombstone_ttl_s(),
            settle_lease_ms=int(settings.DISPATCH_LEASE_S * 1000),
            queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
            targets=[(record.rsplit(":", 1)[-1], record) for record in chunk], waiting_only=True)
        done = [record for record, answer in zip(chunk, answers, strict=True) if answer.outcome == "cancelled"]
        if done:
            forget(done)
        settled += len(done)
    return settled


def descendants(root: int) -> dict[int, str]:
    """Live (not zombie) processes below ``root``, with their command lines, read from /proc."""
    children: dict[int, list[int]] = {}
    state: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                after = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            pid = int(entry.name)
            state[pid] = after[0]
            children.setdefault(int(after[1]), []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        if state.get(pid) == "Z":
            continue
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def leaked_children(before: set[int], kept: set[int] = frozenset()) -> dict[int, str]:
    """Child processes of this process started since ``before`` and still running (``kept``: processes,
    with those below them, that outlive a module on purpose); each is SIGKILLed before this returns."""
    def new() -> dict[int, str]:
        allowed = set(before) | set(kept)
        for pid in kept:
            allowed |= set(descendants(pid))
        return {pid: cmd for pid, cmd in descendants(os.getpid()).items() if pid not in allowed}

    leaked = new()
    if leaked:  # a process group SIGKILLed a moment ago may still be exiting: look again
        time.sleep(0.5)
        leaked = new()
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return leaked
