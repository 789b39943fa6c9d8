"""``/metrics``: the Redis counters and on-demand gauges in Prometheus text format.

A custom collector reads Redis at scrape time (no per-process registry to keep
in sync across web workers); rates and percentiles are left to PromQL
(``rate()``, ``histogram_quantile()``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from lanes import consumers as lane_consumers
from lanes.metrics import DEAD_LETTER_WRITE_FAILURES
from ops import limit_stats, metrics
from ops.limit_stats import LimitRow
from ops.metrics import Counters, LaneGauges

#: Field kinds that are per (lane, type) task counts -> the ``outcome`` label.
OUTCOMES = ("dispatched", "rejected", "started", "succeeded", "retried", "dead", "cancelled")


def families(totals: Counters, gauges: dict[str, LaneGauges], lanes: dict[str, dict], chats: dict,
             dead_letters: dict[str, int], maintenance: dict[str, float] | None = None,
             limits: list[LimitRow] | None = None) -> list[Metric]:
    """Build every metric family from data already read (pure; unit tested)."""
    tasks = CounterMetricFamily(
        "dispatch_tasks", "Task events by lane, type and outcome (dispatched, rejected, started, succeeded, "
        "retried, dead, cancelled).", labels=["lane", "type", "outcome"])
    per_outcome: dict[tuple[str, str, str], float] = {}
    for key, value in totals.items():
        if key[0] in OUTCOMES and len(key) >= 3:
            k = (key[1], key[2], key[0])
            per_outcome[k] = per_outcome.get(k, 0) + value
    for (lane, ttype, outcome), value in sorted(per_outcome.items()):
        tasks.add_metric([lane, ttype, outcome], value)

    rejected = CounterMetricFamily("dispatch_rejections", "Dispatches refused at admission, by reason.",
                                   labels=["lane", "type", "reason"])
    dead = CounterMetricFamily("dispatch_dead_letters", "Tasks that became dead letters, by reason.",
                               labels=["lane", "type", "reason"])
    retries = CounterMetricFamily("dispatch_retries", "Failed attempts scheduled for a retry, by attempt number.",
                                  labels=["lane", "type", "attempt"])
    completed = CounterMetricFamily("dispatch_lane_completed", "Tasks that reached a terminal state, per lane.",
                                    labels=["lane"])
    unwritten = CounterMetricFamily(
        "dispatch_dead_letter_write_failures", "Dead tasks whose dead-letter row could not be written at all "
        "(the task still ended; see the worker log's dead_letter_lost).", labels=["lane", "type"])
    repaired = CounterMetricFamily(
        "dispatch_chats_repaired", "Chat heads (and tasks of no chat) that could not move by themselves, moved on "
        "by the audit, by cause (each one is a bug report: the lane's event log says which task).",
        labels=["lane", "cause"])
    hist_counts: dict[tuple[str, str, str], dict[str, float]] = {}
    hist_sums: dict[tuple[str, str, str], float] = {}
    for key, value in sorted(totals.items()):
        kind = key[0]
        if kind == "rejected" and len(key) == 4:
            rejected.add_metric(list(key[1:]), value)
        elif kind == "dead" and len(key) == 4:
            dead.add_metric(list(key[1:]), value)
        elif kind == "retried" and len(key) == 4:
            retries.add_metric(list(key[1:]), value)
        elif kind == "completed" and len(key) == 2:
            completed.add_metric([key[1]], value)
        elif kind == "chats_repaired" and len(key) == 3:
            repaired.add_metric(list(key[1:]), value)
        elif kind == DEAD_LETTER_WRITE_FAILURES and len(key) == 3:
            unwritten.add_metric(list(key[1:]), value)
        elif kind in ("qlat", "xlat") and len(key) == 4:
            hist_counts.setdefault((kind, key[1], key[2]), {})[key[3]] = value
        elif kind in ("qlat_sum", "xlat_sum") and len(key) == 3:
            hist_sums[(kind[:4], key[1], key[2])] = value

    qlat = HistogramMetricFamily(
        "dispatch_queue_latency_seconds", "Seconds from dispatch to the start of the first attempt.",
        labels=["lane", "type"])
    xlat = HistogramMetricFamily(
        "dispatch_execution_latency_seconds", "Seconds the handler ran, for tasks that finished.",
        labels=["lane", "type"])
    for (kind, lane, ttype), counts in sorted(hist_counts.items()):
        family = qlat if kind == "qlat" else xlat
        family.add_metric([lane, ttype], buckets=metrics.cumulative(counts),
                          sum_value=hist_sums.get((kind, lane, ttype), 0.0))

    depth = GaugeMetricFamily("dispatch_lane_depth", "Messages waiting in the broker, per lane and priority.",
                              labels=["lane", "priority"])
    scheduled = GaugeMetricFamily("dispatch_lane_scheduled_retries",
                                  "Retries waiting for their backoff to pass, and tasks sent for later "
                                  "(countdown / eta) waiting for their due time.", labels=["lane"])
    chat_waiting = GaugeMetricFamily("dispatch_lane_chat_waiting",
                                     "Chat messages waiting behind their chat's head (not yet in the broker).",
                                     labels=["lane"])
    in_flight = GaugeMetricFamily("dispatch_lane_in_flight", "Tasks running now.", labels=["lane"])
    limited = GaugeMetricFamily("dispatch_lane_limited",
                                "Tasks waiting in Redis for a limit to admit them (not in the broker yet).",
                                labels=["lane"])
    capacity = GaugeMetricFamily("dispatch_lane_capacity", "Most tasks a lane holds before rejecting.",
                                 labels=["lane"])
    accepting = GaugeMetricFamily("dispatch_lane_accepting", "1 if the lane admits new tasks.", labels=["lane"])
    paused = GaugeMetricFamily("dispatch_lane_paused", "1 if workers stopped consuming the lane.", labels=["lane"])
    consumers = GaugeMetricFamily(
        "dispatch_lane_consumers", "Live workers holding the lane, from their heartbeats (paused ones included); "
        "0 means nothing consumes it and its tasks wait.", labels=["lane"])
    pending_dead = GaugeMetricFamily("dispatch_dead_letters_pending",
                                     "Dead letters not yet requeued or discarded.", labels=["lane"])
    for lane, g in sorted(gauges.items()):
        for priority, n in sorted(g.depth_by_priority.items()):
            depth.add_metric([lane, str(priority)], n)
        scheduled.add_metric([lane], g.scheduled_retries)
        chat_waiting.add_metric([lane], g.chat_waiting)
        in_flight.add_metric([lane], g.in_flight)
        limited.add_metric([lane], g.limited)
        conf = lanes.get(lane, {})
        capacity.add_metric([lane], conf.get("capacity", 0))
        accepting.add_metric([lane], 1 if conf.get("accepting") else 0)
        paused.add_metric([lane], 1 if conf.get("paused") else 0)
        consumers.add_metric([lane], conf.get("consumers", 0))
    for lane, n in sorted(dead_letters.items()):
        pending_dead.add_metric([lane], n)
    active = GaugeMetricFamily("dispatch_active_chats", "Chats with a backlog.", value=chats.get("active", 0))
    longest = GaugeMetricFamily("dispatch_chat_backlog_max", "The longest chat backlog.",
                                value=chats.get("longest", 0))
    return [tasks, rejected, dead, retries, completed, unwritten, repaired, qlat, xlat, depth, scheduled, chat_waiting,
            in_flight, limited, capacity, accepting, paused, consumers, pending_dead, active, longest,
            *maintenance_families(maintenance or {}), *limit_families(totals, limits or [])]


def limit_families(totals: Counters, limits: list[LimitRow]) -> list[Metric]:
    """Flow control, one series per limit name (never per key: a key's value is unbounded).

    The busiest keys of a limit are on the dashboard and in ``manage.py lanes --json``.
    """
    admitted = CounterMetricFamily("dispatch_limit_admitted", "Tasks a limit admitted (took a token and a slot).",
                                   labels=["limit"])
    throttled = CounterMetricFamily("dispatch_limit_throttled",
                                    "Tasks that had to wait for a limit (counted once per wait).", labels=["limit"])
    for name, counts in sorted(limit_stats.counter_totals(totals).items()):
        if "admitted" in counts:
            admitted.add_metric([name], counts["admitted"])
        if "throttled" in counts:
            throttled.add_metric([name], counts["throttled"])
    in_flight = GaugeMetricFamily("dispatch_limit_in_flight",
                                  "Tasks holding a slot of the limit (published, not finished), all keys together.",
                                  labels=["limit"])
    waiting = GaugeMetricFamily("dispatch_limit_waiting", "Tasks waiting for the limit to admit them, all keys "
                                "together.", labels=["limit"])
    instances = GaugeMetricFamily("dispatch_limit_keys_active",
                                  "Instances of the limit (chats, keys; 1 for global) with work.", labels=["limit"])
    rate = GaugeMetricFamily("dispatch_limit_rate", "Configured rate of one instance (tasks/s); absent: no rate.",
                             labels=["limit"])
    cap = GaugeMetricFamily("dispatch_limit_max_in_flight", "Configured running cap of one instance (the window "
                            "of a fair-share limit); absent: no cap.", labels=["limit"])
    for row in limits:
        in_flight.add_metric([row.name], row.in_flight)
        waiting.add_metric([row.name], row.waiting)
        instances.add_metric([row.name], row.instances)
        if row.rate:
            rate.add_metric([row.name], float(row.rate))
        if row.cap is not None:
            cap.add_metric([row.name], row.cap)
    return [admitted, throttled, in_flight, waiting, instances, rate, cap]


def maintenance_families(stats: dict[str, float]) -> list[Metric]:
    """The maintenance loop's passes and work (it runs in worker and beat threads, not as tasks)."""
    return [
        CounterMetricFamily("dispatch_maintenance_runs", "Maintenance passes run (workers' and beat's threads).",
                            value=stats.get("runs", 0)),
        GaugeMetricFamily("dispatch_maintenance_last_run_timestamp_seconds",
                          "When a maintenance pass last ran (epoch seconds; 0 if never).",
                          value=stats.get("last_run", 0)),
        CounterMetricFamily("dispatch_maintenance_promoted", "Due retries moved onto their lane by maintenance.",
                            value=stats.get("promoted", 0)),
        CounterMetricFamily("dispatch_maintenance_swept",
                            "Tasks republished by the lease sweep (their worker or publisher died).",
                            value=stats.get("swept", 0)),
        CounterMetricFamily("dispatch_maintenance_expired",
                            "Waiting tasks whose deadline passed before a worker started them (expired dead letters).",
                            value=stats.get("expired", 0)),
    ]


def topology_families(topology: dict) -> list[Metric]:
    """Where the platform's Redis master is (``lanes.redis_client.redis_topology``): a failover shows here."""
    master = GaugeMetricFamily("dispatch_redis_master_info", "The Redis the platform writes to now (1).",
                               labels=["address", "role", "sentinel"])
    master.add_metric([topology["master"], topology["role"], "1" if topology["sentinel"] else "0"], 1)
    return [
        master,
        CounterMetricFamily("dispatch_redis_failovers", "Failovers of the Redis master, as its Sentinels count "
                            "them: their configuration epoch, +1 per election (a failover whose first vote split "
                            "counts 2); 0 without Sentinel.", value=topology["failovers"]),
        GaugeMetricFamily("dispatch_redis_connected_replicas", "Replicas connected to the Redis master.",
                          value=topology["replicas"]),
    ]


def memory_families(memory: dict) -> list[Metric]:
    """Redis memory against admission's limit (``ops.metrics.read_memory``): the room, in tasks."""
    families = [
        GaugeMetricFamily("dispatch_redis_used_memory_bytes", "Redis INFO used_memory.", value=memory["used_bytes"]),
        GaugeMetricFamily("dispatch_redis_maxmemory_bytes", "Redis maxmemory (0: none set).",
                          value=memory["maxmemory_bytes"]),
        GaugeMetricFamily("dispatch_redis_bytes_per_waiting_task", "Bytes per waiting task the room is projected at.",
                          value=memory["bytes_per_task"]),
    ]
    if memory["limit_bytes"] is not None:
        families.append(GaugeMetricFamily(
            "dispatch_redis_memory_limit_bytes", "used_memory past which admission refuses (redis_memory_high).",
            value=memory["limit_bytes"]))
        families.append(GaugeMetricFamily(
            "dispatch_redis_room_tasks", "Waiting tasks that still fit below the memory limit.",
            value=memory["room_tasks"]))
    return families


class DispatchCollector(Collector):
    """Reads Redis and the lane table at each scrape."""

    def collect(self) -> Iterator[Metric]:
        from django.conf import settings

        from lanes.models import Lane
        from lanes.redis_client import get_redis, redis_topology

        client = get_redis()
        now = time.time()
        lanes = {lane.name: {"capacity": lane.capacity, "accepting": lane.accepting} for lane in Lane.objects.all()}
        paused, _ = metrics.read_control_state(client, lanes)
        for name in paused:
            lanes[name]["paused"] = True
        for name, holders in lane_consumers.read_holders(client, lanes, now).items():
            lanes[name]["consumers"] = len(holders)
        totals = metrics.read_totals(client)
        gauges = metrics.read_gauges(client, lanes, now, settings.DISPATCH_LEASE_S)
        yield from families(
            totals=totals,
            gauges=gauges,
            lanes=lanes,
            chats=metrics.read_chats(client, top=1),
            dead_letters=metrics.dead_letter_counts(),
            maintenance=metrics.read_maintenance(client),
            limits=limit_stats.read_limits(client, now, rates={}, totals={}, top=0),
        )
        yield from topology_families(redis_topology())
        yield from memory_families(metrics.read_memory(client, sum(g.waiting for g in gauges.values()),
                                                       settings.DISPATCH_MEMORY_HIGH))
        yield from worker_families(lane_consumers.read_workers(client, now))


def worker_families(beats: list[lane_consumers.Heartbeat]) -> list[Metric]:
    """Per live worker: threads stuck in a handler past its attempt's limit (pure; from the heartbeats)."""
    stuck = GaugeMetricFamily(
        "dispatch_worker_stuck_threads", "Threads of a worker still busy in a handler whose attempt ran past its "
        "limit (the attempt was retried; the thread is capacity lost until the handler returns).",
        labels=["worker"])
    for beat in sorted(beats, key=lambda b: b.hostname):
        stuck.add_metric([beat.hostname], beat.stuck)
    return [stuck]


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DispatchCollector())
    return reg
