"""Reading the platform's metrics for ``/metrics``, the admin dashboard and ``manage.py lanes``.

Counters are kept by the Lua scripts inside the Redis call each step already
makes (no extra round trip on the hot path): an all-time hash and one hash per
minute, kept 20 minutes, with fields ``kind|lane|type[|extra]`` (the layout and
the engine's own writes: ``lanes.metrics``). Gauges (depth, retries, in flight,
chats) are read on demand, and the charts' samples are taken here. Readers here do one or two
pipelined round trips; everything after the read is pure aggregation, unit
tested without Redis.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lanes import capacity, counters, histogram, keys
from lanes import consumers as lane_consumers
from lanes.metrics import MAINTENANCE_COUNTS
from lanes.priorities import from_kombu
from ops import limit_stats

if TYPE_CHECKING:
    from redis import Redis

#: A parsed counter hash: the field split on ``|`` -> its value.
Counters = dict[tuple[str, ...], float]

#: Minute hashes read for the dashboard: the current (partial) one and 15 before it.
WINDOW_MINUTES = 15
#: Rate windows shown to operators, in minutes.
RATE_WINDOWS = (1, 5, 15)
#: Seconds between two depth/throughput samples (any process may take one).
SAMPLE_INTERVAL_S = 5.0
#: Seconds of samples kept (the charts show the last 15 minutes).
SAMPLE_KEEP_S = 16 * 60


# --- pure: parsing and aggregation --------------------------------------------

def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_counters(raw: Mapping[bytes | str, bytes | str]) -> Counters:
    """Split each ``kind|lane|type[|extra]`` field; values become numbers."""
    out: Counters = {}
    for name, value in raw.items():
        out[tuple(_text(name).split("|"))] = float(_text(value))
    return out


def merge(counters: Iterable[Counters]) -> Counters:
    out: Counters = defaultdict(float)
    for one in counters:
        for key, value in one.items():
            out[key] += value
    return dict(out)


def total(counters: Counters, kind: str, lane: str | None = None) -> float:
    """Sum of ``kind`` over every type (and extra label) of ``lane`` (all lanes if None)."""
    return sum(v for k, v in counters.items() if k[0] == kind and (lane is None or k[1] == lane))


def by_label(counters: Counters, kind: str, lane: str | None, index: int) -> dict[str, float]:
    """Sum of ``kind`` of ``lane`` grouped by the label at position ``index`` of the field."""
    out: dict[str, float] = defaultdict(float)
    for key, value in counters.items():
        if key[0] == kind and (lane is None or key[1] == lane) and len(key) > index:
            out[key[index]] += value
    return dict(out)


def lane_histogram(counters: Counters, name: str, lane: str) -> dict[str, int]:
    """Per-bucket (non-cumulative) counts of latency histogram ``name`` (qlat/xlat) over a lane's types."""
    return {label: int(n) for label, n in by_label(counters, name, lane, 3).items()}


def cumulative(counts: Mapping[str, float]) -> list[tuple[str, float]]:
    """Prometheus ``le`` buckets (cumulative, ending at +Inf) from per-bucket counts."""
    running = 0.0
    out = []
    for label in histogram.labels():
        running += counts.get(label, 0)
        out.append((label, running))
    return out


def rate(count: float, minutes: int, elapsed_s: float) -> float:
    """Events per second over the current partial minute and the ``minutes`` full ones before it."""
    span = minutes * 60 + max(0.0, min(60.0, elapsed_s))
    return count / span if span > 0 else 0.0


def series_from_samples(samples: list[tuple[float, int, float]], interval_s: float = SAMPLE_INTERVAL_S
                        ) -> list[dict[str, float | None]]:
    """Chart points from (time, waiting, completed-total) samples; throughput is the slope between two.

    A gap longer than four intervals (nobody sampling) or a counter going
    backwards (metrics reset) gives no throughput for that point.
    """
    points: list[dict[str, float | None]] = []
    previous = None
    for t, waiting, completed in sorted(samples):
        throughput = None
        if previous is not None:
            dt, dc = t - previous[0], completed - previous[2]
            if 0 < dt <= 4 * interval_s and dc >= 0:
                throughput = dc / dt
        points.append({"t": t, "waiting": waiting, "throughput": throughput})
        previous = (t, waiting, completed)
    return points


@dataclass
class LaneGauges:
    """What a lane holds right now."""

    depth_by_priority: dict[int, int] = field(default_factory=dict)  # our priority (9 = most urgent)
    scheduled_retries: int = 0
    chat_waiting: int = 0
    in_flight: int = 0
    #: Tasks waiting in Redis for a limit to admit them (``lanes.keys.lane_limited``): not in the broker yet.
    limited: int = 0

    @property
    def depth(self) -> int:
        """Messages in the broker lists, ready for a worker."""
        return sum(self.depth_by_priority.values())

    @property
    def waiting(self) -> int:
        """Everything admission counts against the capacity: depth, scheduled retries, chat backlogs, limits."""
        return self.depth + self.scheduled_retries + self.chat_waiting + self.limited

    @property
    def remaining(self) -> int:
        """What a drain waits for: everything waiting plus what is running."""
        return self.waiting + self.in_flight


def lane_stats(lane: str, minutes: list[Counters], elapsed_s: float) -> dict[str, Any]:
    """A lane's recent activity from the minute hashes (``minutes[0]`` is the current, partial one)."""
    stats: dict[str, Any] = {}
    for kind in ("dispatched", "completed"):
        stats[f"{kind}_per_s"] = {
            f"{w}m": round(rate(sum(total(m, kind, lane) for m in minutes[: w + 1]), w, elapsed_s), 3)
            for w in RATE_WINDOWS
        }
    window = merge(minutes[: WINDOW_MINUTES + 1])
    counts = {kind: int(total(window, kind, lane))
              for kind in ("dispatched", "rejected", "started", "succeeded", "retried", "dead", "completed",
                           "cancelled")}
    stats["counts_15m"] = counts
    finished = counts["succeeded"] + counts["dead"]
    stats["failure_rate_15m"] = round(counts["dead"] / finished, 4) if finished else None
    stats["retries_by_attempt_15m"] = {
        k: int(v) for k, v in sorted(by_label(window, "retried", lane, 3).items(), key=lambda kv: int(kv[0]))
    }
    stats["dead_by_reason_15m"] = {k: int(v) for k, v in sorted(by_label(window, "dead", lane, 3).items())}
    stats["rejected_by_reason_15m"] = {k: int(v) for k, v in sorted(by_label(window, "rejected", lane, 3).items())}
    for name, label in (("qlat", "queue_latency"), ("xlat", "execution_latency")):
        counts_h = lane_histogram(window, name, lane)
        for q in (0.5, 0.95):
            value = histogram.quantile(counts_h, q)
            stats[f"{label}_p{int(q * 100)}_s"] = round(value, 4) if value is not None else None
    return stats


def rejections_by_reason(window: Counters) -> list[dict[str, Any]]:
    """Rejections of the window per (lane, type, reason), most frequent first."""
    rows = [{"lane": k[1], "type": k[2], "reason": k[3], "count": int(v)}
            for k, v in window.items() if k[0] == "rejected" and len(k) >= 4 and v]
    return sorted(rows, key=lambda r: (-r["count"], r["lane"], r["type"], r["reason"]))


def format_rate(value: float) -> str:
    """Short form of a per-second rate for tables: 25.9, 3.69, 0.068."""
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"


def format_seconds(value: float | None) -> str:
    """Short human form of a latency for tables: 12ms, 1.4s, 3m."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    return f"{value / 60:.0f}m"


# --- Redis reads -------------------------------------------------------------

def read_totals(client: Redis) -> Counters:
    """The all-time counters (what Prometheus scrapes); this process's pending counts are written first."""
    counters.flush(client)
    return parse_counters(client.hgetall(keys.METRICS_TOTAL))


def read_minutes(client: Redis, now: float, count: int = WINDOW_MINUTES + 1) -> list[Counters]:
    """Minute hashes, newest first: index 0 is the current minute (this process's pending counts included)."""
    counters.flush(client)
    minute = int(now // 60)
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.hgetall(keys.metrics_minute(minute - i))
    return [parse_counters(raw) for raw in pipe.execute()]


def read_in_flight(client: Redis, now: float, lease_s: float, limit: int = 10000) -> dict[str, int]:
    """Running tasks per lane: records whose lease is live and whose state is ``running``.

    A running task's lease ends within ``lease_s`` (it is renewed while the
    handler runs); queued records have far longer leases, so the window holds
    few records beyond the running ones, and each is checked by its state.
    """
    now_ms = int(now * 1000)
    records = client.zrangebyscore(keys.LEASES, now_ms, now_ms + int((lease_s + 5) * 1000), start=0, num=limit)
    if not records:
        return {}
    pipe = client.pipeline(transaction=False)
    for record in records:
        pipe.hmget(record, "st", "lane")
    counts: dict[str, int] = defaultdict(int)
    for st, lane in pipe.execute():
        if st == b"running" and lane:
            counts[lane.decode()] += 1
    return dict(counts)


def read_gauges(client: Redis, lanes: Iterable[str], now: float, lease_s: float) -> dict[str, LaneGauges]:
    """Depth per priority, scheduled retries, chat backlog and in-flight count of each lane."""
    names = list(lanes)
    pipe = client.pipeline(transaction=False)
    for lane in names:
        for queue in keys.lane_queues(lane):
            pipe.llen(queue)
        pipe.zcard(keys.lane_delayed(lane))
        pipe.get(keys.lane_chat_waiting(lane))
        pipe.get(keys.lane_limited(lane))
    replies = pipe.execute()
    running = read_in_flight(client, now, lease_s)
    out = {}
    step = keys.PRIORITY_LEVELS + 3
    for i, lane in enumerate(names):
        chunk = replies[i * step:(i + 1) * step]
        out[lane] = LaneGauges(
            depth_by_priority={from_kombu(p): int(n) for p, n in enumerate(chunk[: keys.PRIORITY_LEVELS])},
            scheduled_retries=int(chunk[-3]),
            chat_waiting=max(0, int(chunk[-2] or 0)),
            in_flight=running.get(lane, 0),
            limited=max(0, int(chunk[-1] or 0)),
        )
    return out


def read_chats(client: Redis, top: int = 10) -> dict[str, Any]:
    """Chats with a backlog: how many, the longest backlog, and the top ones with their head task."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.chat_index())
    pipe.zrevrange(keys.chat_index(), 0, max(0, top - 1), withscores=True)
    active, leaders = pipe.execute()
    rows = [{"chat": _text(chat), "backlog": int(score)} for chat, score in leaders]
    if rows:
        pipe = client.pipeline(transaction=False)
        for row in rows:
            pipe.lindex(keys.chat_queue(row["chat"]), 0)
        heads = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for row, head in zip(rows, heads, strict=True):
            row["head"] = _text(head) if head else ""
            pipe.hmget(keys.task_record(row["head"], row["chat"]), "lane", "type", "st", "att")
        for row, (lane, ttype, st, att) in zip(rows, pipe.execute(), strict=True):
            row.update(lane=_text(lane or b""), type=_text(ttype or b""), state=_text(st or b""),
                       attempt=int(att or 0))
    return {"active": int(active), "longest": rows[0]["backlog"] if rows else 0, "top": rows}


def read_recent_rejections(client: Redis, count: int = 20) -> list[dict[str, Any]]:
    out = []
    for raw in client.lrange(keys.REJECTIONS_RECENT, 0, count - 1):
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def maybe_sample(client: Redis, lanes: Iterable[str], now: float | None = None) -> bool:
    """Record one (waiting, completed-total) sample per lane, at most once per interval across processes."""
    if not client.set(keys.SAMPLE_LOCK, "1", nx=True, px=int(SAMPLE_INTERVAL_S * 1000 * 0.9)):
        return False
    record_sample(client, lanes, now if now is not None else time.time())
    return True


#: A limit's current rate spans at least this many seconds (one sample interval more, at most):
#: the 1-minute figure of a limit that just started is its partial minute's average, far under it.
CURRENT_RATE_MIN_S = 10.0
#: Seconds of limit samples kept.
LIMIT_SAMPLE_KEEP_S = 120.0


def record_limit_sample(client: Redis, now: float, totals: Counters | None = None) -> None:
    """One sample of every limit's all-time admitted count (what ``current_limit_rates`` compares with)."""
    totals = read_totals(client) if totals is None else totals
    admitted = {k[1]: v for k, v in totals.items() if k[0] == "lim_admitted" and len(k) == 2}
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.LIMIT_SAMPLES, {f"{now:.3f}|{json.dumps(admitted, sort_keys=True)}": now})
    pipe.zremrangebyscore(keys.LIMIT_SAMPLES, "-inf", now - LIMIT_SAMPLE_KEEP_S)
    pipe.expire(keys.LIMIT_SAMPLES, int(LIMIT_SAMPLE_KEEP_S) + 60)
    pipe.execute()


def current_limit_rates(client: Redis, now: float, totals: Counters) -> dict[str, float]:
    """Admitted/s of each limit since the newest sample at least :data:`CURRENT_RATE_MIN_S` old."""
    found = client.zrevrangebyscore(keys.LIMIT_SAMPLES, now - CURRENT_RATE_MIN_S, now - LIMIT_SAMPLE_KEEP_S,
                                    start=0, num=1)
    if not found:
        return {}
    try:
        at, _, counts = _text(found[0]).partition("|")
        then, before = float(at), json.loads(counts)
    except ValueError:
        return {}
    span = now - then
    out = {}
    for k, v in totals.items():
        if k[0] == "lim_admitted" and len(k) == 2 and span > 0:
            out[k[1]] = round(max(0.0, v - float(before.get(k[1], 0.0))) / span, 3)
    return out


def record_sample(client: Redis, lanes: Iterable[str], now: float) -> None:
    record_limit_sample(client, now)
    names = list(lanes)
    if not names:
        return
    pipe = client.pipeline(transaction=False)
    for lane in names:
        for queue in keys.lane_queues(lane):
            pipe.llen(queue)
        pipe.zcard(keys.lane_delayed(lane))
        pipe.get(keys.lane_chat_waiting(lane))
        pipe.get(keys.lane_limited(lane))
        pipe.hget(keys.METRICS_TOTAL, f"completed|{lane}")
    replies = pipe.execute()
    step = keys.PRIORITY_LEVELS + 4
    pipe = client.pipeline(transaction=False)
    for i, lane in enumerate(names):
        chunk = replies[i * step:(i + 1) * step]
        waiting = (sum(int(n) for n in chunk[: keys.PRIORITY_LEVELS]) + int(chunk[-4])
                   + max(0, int(chunk[-3] or 0)) + max(0, int(chunk[-2] or 0)))
        completed = int(chunk[-1] or 0)
        key = keys.metrics_samples(lane)
        pipe.zadd(key, {f"{now:.3f}:{waiting}:{completed}": now})
        pipe.zremrangebyscore(key, "-inf", now - SAMPLE_KEEP_S)
        pipe.expire(key, int(SAMPLE_KEEP_S) + 60)
    pipe.execute()


def read_samples(client: Redis, lanes: Iterable[str], now: float, window_s: float = WINDOW_MINUTES * 60
                 ) -> dict[str, list[tuple[float, int, float]]]:
    names = list(lanes)
    pipe = client.pipeline(transaction=False)
    for lane in names:
        pipe.zrangebyscore(keys.metrics_samples(lane), now - window_s, "+inf")
    out = {}
    for lane, members in zip(names, pipe.execute(), strict=True):
        samples = []
        for member in members:
            try:
                t, waiting, completed = _text(member).split(":")
                samples.append((float(t), int(waiting), float(completed)))
            except ValueError:
                continue
        out[lane] = samples
    return out


def read_control_state(client: Redis, lanes: Iterable[str]) -> tuple[set[str], set[str]]:
    """(paused lanes, draining lanes)."""
    pipe = client.pipeline(transaction=False)
    pipe.smembers(keys.PAUSED_LANES)
    pipe.smembers(keys.DRAINING_LANES)
    paused, draining = pipe.execute()
    wanted = set(lanes)
    return {_text(x) for x in paused} & wanted, {_text(x) for x in draining} & wanted


# --- Django reads --------------------------------------------------------------

def dead_letter_counts() -> dict[str, int]:
    """Pending (not requeued or discarded) dead letters per lane."""
    from django.db.models import Count

    from tasks.models import DeadLetter

    return {row["lane"]: row["n"] for row in DeadLetter.objects.pending().values("lane").annotate(n=Count("id"))}


@dataclass
class LaneRow:
    """One lane as the dashboard and ``manage.py lanes`` show it."""

    name: str
    capacity: int
    accepting: bool
    paused: bool
    draining: bool
    depth: int
    depth_by_priority: dict[int, int]
    scheduled_retries: int
    chat_waiting: int
    waiting: int
    in_flight: int
    dead_letters: int
    #: Tasks waiting on a limit (in ``waiting``, not in ``depth``).
    limited: int
    stats: dict[str, Any]
    series: list[dict[str, float | None]]
    #: Live workers holding the lane, from their heartbeats (``lanes.consumers``).
    consumers: list[str] = field(default_factory=list)

    @property
    def consuming(self) -> str:
        """``consuming``, ``paused``, or ``no worker``: tasks admitted to it wait until a worker comes."""
        return lane_consumers.state(len(self.consumers), self.paused)

    @property
    def has_consumer(self) -> bool:
        return bool(self.consumers)

    @property
    def admission(self) -> str:
        if self.draining:
            return "draining" if self.waiting + self.in_flight else "drained"
        return "open" if self.accepting else "closed"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["consuming"] = self.consuming
        data["has_consumer"] = self.has_consumer
        data["admission"] = self.admission
        data["depth_by_priority"] = {str(p): n for p, n in sorted(self.depth_by_priority.items(), reverse=True)}
        return data


def read_maintenance(client: Redis) -> dict[str, float]:
    """``runs``, ``promoted``, ``swept``, ``expired`` totals and ``last_run`` (epoch s; 0 if never)."""
    raw = {_text(k): float(v) for k, v in client.hgetall(keys.MAINTENANCE_STATS).items()}
    return {name: raw.get(name, 0.0) for name in (*MAINTENANCE_COUNTS, "last_run")}


#: Below this many waiting tasks the room is projected at the measured bytes per task (lanes.capacity),
#: above it at what Redis holds per waiting task now (all of used_memory counted: the room errs low).
ROOM_MIN_BACKLOG = 1000


def read_memory(client: Redis, waiting: int, high: float) -> dict[str, Any]:
    """Redis memory used, its maxmemory, admission's limit there, and the room below it in waiting tasks.

    Without a maxmemory the limit is ``high`` of the machine's memory (Redis would grow until the
    kernel stops it); ``limited_by`` says which.
    """
    info = client.info("memory")
    used, maxmemory = int(info["used_memory"]), int(info.get("maxmemory", 0))
    limit = capacity.memory_limit(maxmemory, high)
    limited_by = "maxmemory"
    if limit is None:
        limit = capacity.memory_limit(int(info.get("total_system_memory", 0)), high)
        limited_by = "machine memory" if limit is not None else "none"
    per_task = capacity.PATHS["plain"].bytes_waiting
    if waiting >= ROOM_MIN_BACKLOG:
        per_task = used / waiting
    return {"used_bytes": used, "maxmemory_bytes": maxmemory, "limit_bytes": limit, "limited_by": limited_by,
            "bytes_per_task": round(per_task, 1), "waiting": waiting,
            "room_tasks": capacity.room_tasks(used, limit, per_task),
            "used_human": _human_bytes(used), "limit_human": _human_bytes(limit) if limit else "-"}


def _human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def snapshot(client: Redis | None = None, now: float | None = None,
             lane_names: list[str] | None = None) -> dict[str, Any]:
    """Everything the dashboard and ``manage.py lanes`` show, as JSON-able data."""
    from django.conf import settings

    from lanes.models import Lane
    from lanes.redis_client import get_redis

    client = client or get_redis()
    now = time.time() if now is None else now
    lanes = list(Lane.objects.all())
    if lane_names is not None:
        lanes = [lane for lane in lanes if lane.name in set(lane_names)]
    names = [lane.name for lane in lanes]
    try:
        maybe_sample(client, names, now)
    except Exception:  # noqa: BLE001 - a missed sample only leaves a gap in a chart
        pass
    gauges = read_gauges(client, names, now, settings.DISPATCH_LEASE_S)
    minutes = read_minutes(client, now)
    samples = read_samples(client, names, now)
    paused, draining = read_control_state(client, names)
    holders = lane_consumers.read_holders(client, names, now)
    dead = dead_letter_counts()
    elapsed = now % 60
    rows = []
    for lane in lanes:
        g = gauges[lane.name]
        rows.append(LaneRow(
            name=lane.name, capacity=lane.capacity, accepting=lane.accepting, paused=lane.name in paused,
            draining=lane.name in draining, depth=g.depth, depth_by_priority=g.depth_by_priority,
            scheduled_retries=g.scheduled_retries, chat_waiting=g.chat_waiting, waiting=g.waiting,
            in_flight=g.in_flight, dead_letters=dead.get(lane.name, 0), limited=g.limited,
            stats=lane_stats(lane.name, minutes, elapsed), series=series_from_samples(samples[lane.name]),
            consumers=holders.get(lane.name, []),
        ))
    window = merge(minutes)
    all_time = read_totals(client)
    rates = limit_stats.counter_rates(minutes, RATE_WINDOWS, elapsed, rate)
    for name, per_s in current_limit_rates(client, now, all_time).items():
        rates.setdefault(name, {}).setdefault("admitted", {})["now"] = per_s
    limits = limit_stats.read_limits(client, now, rates=rates, totals=limit_stats.counter_totals(all_time))
    return {
        "generated_at": now,
        "lanes": [row.as_dict() for row in rows],
        "limits": [row.as_dict() for row in limits],
        "chats": read_chats(client),
        "rejections": {"by_reason_15m": rejections_by_reason(window)[:20],
                       "recent": read_recent_rejections(client)},
        "dead_letters_total": sum(dead.values()),
        "redis_memory": read_memory(client, sum(g.waiting for g in gauges.values()), settings.DISPATCH_MEMORY_HIGH),
        "stuck_threads": stuck_threads(lane_consumers.read_workers(client, now)),
        "chats_repaired": chats_repaired(all_time),
    }


def stuck_threads(beats: list[lane_consumers.Heartbeat]) -> dict[str, Any]:
    """Threads still busy in a handler past its attempt's limit, per worker that has any (its lost capacity)."""
    by_worker = {b.hostname: b.stuck for b in sorted(beats, key=lambda b: b.hostname) if b.stuck}
    return {"total": sum(by_worker.values()), "by_worker": by_worker}


def chats_repaired(totals: Counters) -> list[dict[str, Any]]:
    """Chats the audit had to move on, by lane and cause, most first: each one is a bug to look into."""
    rows = [{"lane": key[1], "cause": key[2], "count": int(n)} for key, n in totals.items()
            if key[0] == "chats_repaired" and len(key) == 3]
    return sorted(rows, key=lambda r: (-r["count"], r["lane"], r["cause"]))


def table_rows(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's lane table flattened for a terminal."""
    rows = []
    for lane in snap["lanes"]:
        s = lane["stats"]
        retries = " ".join(f"{a}:{n}" for a, n in s["retries_by_attempt_15m"].items())
        fail = s["failure_rate_15m"]
        rows.append({
            "lane": lane["name"], "admission": lane["admission"], "consuming": lane["consuming"],
            "workers": len(lane["consumers"]),
            "depth": lane["depth"], "retries": lane["scheduled_retries"], "chat_wait": lane["chat_waiting"],
            "limited": lane["limited"],
            "in_flight": lane["in_flight"],
            "disp/s 1m": s["dispatched_per_s"]["1m"], "done/s 1m": s["completed_per_s"]["1m"],
            "done/s 15m": s["completed_per_s"]["15m"],
            "qlat p50": format_seconds(s["queue_latency_p50_s"]), "qlat p95": format_seconds(s["queue_latency_p95_s"]),
            "fail% 15m": f"{fail * 100:.1f}" if fail is not None else "-",
            "retries by attempt": retries or "-", "dead": lane["dead_letters"],
        })
    return rows


def limit_table_rows(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's limits table flattened for a terminal (the busiest keys in one column)."""
    rows = []
    for lim in snap.get("limits", []):
        rate_1m = lim["admitted_per_s"].get("1m", 0.0)
        busiest = " ".join(
            f"{b['key']}:{b['in_flight']}+{b['waiting']}" for b in lim["busiest"] if lim["scope"] != "global")
        rows.append({
            "limit": lim["name"], "scope": lim["scope"] + (" fair" if lim["fair_share"] else ""),
            "rate/s now": format_rate(lim["admitted_per_s"]["now"]) if "now" in lim["admitted_per_s"] else "-",
            "rate/s 1m": format_rate(rate_1m),
            "limit/s": format_rate(lim["rate"]) if lim["rate"] else "-",
            "in flight": lim["in_flight"], "cap": lim["cap"] if lim["cap"] is not None else "-",
            "waiting": lim["waiting"],
            "throttled/s 1m": format_rate(lim["throttled_per_s"].get("1m", 0.0)),
            "keys": f"{lim['instances']}{'+' if lim['partial'] else ''}" if lim["scope"] != "global" else "-",
            "busiest (running+waiting)": busiest or "-",
        })
    return rows
