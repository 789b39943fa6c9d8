"""``claim_group.lua``'s wrapper: claim a worker's group of delivered plain tasks in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django.conf import settings

from lanes import counters, keys
from lanes.lua.loader import call

NAME = "claim_group"


class GroupItem(NamedTuple):
    """One delivered task to claim (the fields ``claim_group.lua`` reads per item, in its order)."""

    task_id: str
    record: str
    attempt: int
    owner: str
    chat: str  # '' when it has no chat


class Claim(NamedTuple):
    """``claim_record``'s answer for one item: ``status`` 'run' (then ``detail`` is its delivery count),
    'finished' (``detail``: 'outcome|result'), 'busy' (``detail``: the owner), 'poison', 'stale',
    'nothead' or 'gone'."""

    status: str
    detail: str


class GroupClaims(NamedTuple):
    config_version: str
    claims: list[Claim]


def claim_group(*, items: Sequence[GroupItem], now: float, lease_ms: int, max_deliveries: int, process: str,
                liveness_ms: int, counts: Sequence[tuple[str, str, float]]) -> GroupClaims:
    """Run claim_group.lua (KEYS/ARGV in its header); one ``Claim`` per item, in order.

    ``counts``: each item's (metric field 'lane|type', queue latency bucket or '', queue latency
    seconds): an item that will run is counted here, in process (``lanes.counters``), as
    ``lanes.lua.start`` counts a single claim. With ``DISPATCH_REPLICA_ACKS`` > 0 the claims
    must reach the replicas, as a single claim's (``lanes.lua.start``), else ``ReplicaAcksMissing``.
    """
    args: list[object] = [int(now * 1000), lease_ms, max_deliveries, process, liveness_ms, keys.LANE_PREFIX]
    for item in items:
        args += [item.task_id, item.record, item.attempt, item.owner,
                 keys.chat_queue(item.chat) if item.chat else "", keys.tombstone(item.task_id)]
    reply = call(
        NAME, [keys.LEASES, keys.CONFIG_VERSION, keys.DEADLINES, keys.PROCS, keys.process_held(process)], args,
        replicas=settings.DISPATCH_REPLICA_ACKS, replicas_timeout_ms=settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS,
        wait_if=lambda r: b"run" in r[1::2],
    )
    version = reply[0].decode()
    claims = [Claim(reply[i].decode(), reply[i + 1].decode(errors="replace"))
              for i in range(1, len(reply), 2)]
    for claim, (field, bucket, seconds) in zip(claims, counts, strict=True):
        if claim.status == "run":
            counters.add(f"started|{field}", now)
            counters.observe("qlat", field, bucket, seconds, now)
    return GroupClaims(version, claims)
