"""``claim_batch.lua``'s wrapper: take and claim more ready tasks of one batched type."""

from __future__ import annotations

from typing import NamedTuple

import orjson
from django.conf import settings

from lanes import counters, keys
from lanes.lua.loader import call
from lanes.messages import kombu_message

NAME = "claim_batch"
#: Most messages one call looks at per task it may claim (a lane shared with other
#: types has their messages in between), plus a fixed margin.
LOOK_PER_TASK = 2
LOOK_MARGIN = 32


class BatchClaimed(NamedTuple):
    """claim_batch.lua's answer: the messages it took and claimed, as a pop delivers them (JSON)."""

    messages: list[bytes]


def claim_batch(
    *, lane: str, handler: str, task_type: str, owner: str, now: float, lease_ms: int, max_deliveries: int,
    most: int, metric_field: str, process: str, liveness_ms: int,
) -> BatchClaimed:
    """Run claim_batch.lua (KEYS/ARGV in its header): up to ``most`` more tasks, claimed.

    With ``DISPATCH_REPLICA_ACKS`` > 0, claims that replicas did not confirm
    raise ``ReplicaAcksMissing`` (as ``lanes.lua.start.start``): the caller
    drops them and their leases bring them back. Confirmed claims are counted
    here, in process (``lanes.counters``: started). ``liveness_ms``: 0 once
    this process has beaten (``lanes.leases.LeaseBook.liveness_ms``).
    """
    if most <= 0:
        return BatchClaimed([])
    reply: list[bytes] = call(
        NAME,
        [keys.LEASES, keys.DEADLINES, keys.PROCS, keys.process_held(process), *keys.lane_queues(lane)],
        [handler, task_type, owner, int(now * 1000), lease_ms, max_deliveries, most,
         most * LOOK_PER_TASK + LOOK_MARGIN, process, liveness_ms, keys.CHAT_PREFIX, keys.LANE_PREFIX],
        replicas=settings.DISPATCH_REPLICA_ACKS, replicas_timeout_ms=settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS,
        wait_if=bool,
    )
    # The script answers stored message, record, delivery tag a task: written out as a pop delivers them.
    taken = [orjson.dumps(kombu_message(reply[i], reply[i + 2].decode().rpartition(".")[0], reply[i + 1].decode(),
                                        reply[i + 2].decode()))
             for i in range(0, len(reply), 3)]
    if taken:
        counters.add(f"started|{metric_field}", now, len(taken))
    return BatchClaimed(taken)
