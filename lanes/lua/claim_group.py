"""``claim_group.lua``'s wrapper: a worker's group call: finish what succeeded, claim what was delivered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django.conf import settings

from lanes import counters, keys
from lanes.lua.finish_batch import DoneItem
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
    #: One reply per finished item, in order: 'ok' | 'already' | 'gone' | 'taken' (as finish_batch's).
    finished: list[str] = []


class FinishTerms(NamedTuple):
    """What the finish of the call's succeeded items needs besides the items (as ``finish_batch``'s)."""

    tombstone_ttl_s: int
    queued_lease_ms: int
    settle_lease_ms: int


def claim_group(*, items: Sequence[GroupItem], now: float, lease_ms: int, max_deliveries: int, process: str,
                liveness_ms: int, counts: Sequence[tuple[str, str, float]], done: Sequence[DoneItem] = (),
                finish: FinishTerms | None = None) -> GroupClaims:
    """Run claim_group.lua (KEYS/ARGV in its header); one ``Claim`` per item, in order, and one reply per
    ``done`` item (finished first, each as ``finish_batch`` finishes one; their counts are the caller's,
    ``finish_batch.count_batch``).

    ``counts``: each item's (metric field 'lane|type', queue latency bucket or '', queue latency
    seconds): an item that will run is counted here, in process (``lanes.counters``), as
    ``lanes.lua.start`` counts a single claim. With ``DISPATCH_REPLICA_ACKS`` > 0 the claims
    must reach the replicas, as a single claim's (``lanes.lua.start``), else ``ReplicaAcksMissing``
    (then the finish part's replies are lost with it: such a worker finishes in calls of their own).
    """
    if done and finish is None:
        raise ValueError("claim_group: finished items need their FinishTerms")
    terms = finish or FinishTerms(0, 0, 0)
    args: list[object] = [int(now * 1000), lease_ms, max_deliveries, process, liveness_ms, keys.LANE_PREFIX,
                          len(items), terms.tombstone_ttl_s, terms.queued_lease_ms, terms.settle_lease_ms,
                          keys.lane_chat_waiting(""), keys.LIMIT_PREFIX, keys.CHAT_PREFIX, keys.tombstone("")]
    for item in items:
        args += [item.task_id, item.record, item.attempt, item.owner,
                 keys.chat_queue(item.chat) if item.chat else "", keys.tombstone(item.task_id)]
    for entry in done:
        args.extend(entry)
    n = len(items)
    reply = call(
        NAME, [keys.LEASES, keys.CONFIG_VERSION, keys.DEADLINES, keys.PROCS, keys.process_held(process),
               keys.chat_index(), keys.METRICS_TOTAL, keys.metrics_minute(int(now // 60))], args,
        replicas=settings.DISPATCH_REPLICA_ACKS, replicas_timeout_ms=settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS,
        wait_if=lambda r: b"run" in r[1:1 + 2 * n:2],
    )
    version = reply[0].decode()
    claims = [Claim(reply[i].decode(), reply[i + 1].decode(errors="replace"))
              for i in range(1, 1 + 2 * n, 2)]
    finished = [r.decode() if isinstance(r, bytes) else str(r) for r in reply[1 + 2 * n:]]
    for claim, (field, bucket, seconds) in zip(claims, counts, strict=True):
        if claim.status == "run":
            counters.add(f"started|{field}", now, 1)
            counters.observe("qlat", field, bucket, seconds, now)
    return GroupClaims(version, claims, finished)
