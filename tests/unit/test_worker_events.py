"""Folding a worker's task events per run: what Flower's event state records must not change."""

from __future__ import annotations

from celery.events.state import State
from hypothesis import given
from hypothesis import strategies as st

from tasks.worker_events import fold_batch, fold_task_events
from tests.support.hypothesis_profile import bounded

KEEP = ("state", "name", "args", "kwargs", "result", "runtime", "received", "started", "succeeded", "failed",
        "retried", "rejected", "revoked", "retries", "exception", "eta", "expires", "parent_id", "root_id")


def ev(type_: str, uuid: str, ts: float, clock: int, **fields) -> dict:
    return {"type": type_, "uuid": uuid, "timestamp": ts, "clock": clock, "hostname": "w@h", "pid": 1,
            "utcoffset": 0, "local_received": ts, **fields}


def run_of(uuid: str, at: float, clock: int) -> list[dict]:
    return [
        ev("task-received", uuid, at, clock, name="tasks.dispatch", args="()", kwargs="{'x': 1}", retries=0),
        ev("task-started", uuid, at + 0.1, clock + 1),
        ev("task-succeeded", uuid, at + 0.3, clock + 2, result="'ok'", runtime=0.2),
    ]


def tasks_seen(events: list[dict]) -> dict[str, dict]:
    state = State()
    for event in events:
        state.event(dict(event))
    seen = {uuid: {k: getattr(task, k) for k in KEEP} for uuid, task in state.tasks.items()}
    for uuid, task in state.tasks.items():
        seen[uuid]["worker"] = task.worker.hostname if task.worker else None
    return seen


def prefetched(events: list[dict]) -> list[int]:
    """Flower's ``flower_worker_prefetched_tasks`` after each event (flower.events.PrometheusMetrics.observe_task)."""
    state, gauge, seen = State(), 0, []
    for event in events:
        state.event(dict(event))
        task = state.tasks[event["uuid"]]
        if task.received and not task.eta:
            if event["type"] == "task-received":
                gauge += 1
            elif event["type"] == "task-started" and task.started:
                gauge -= 1
            elif event["type"] in ("task-revoked", "task-rejected") and not task.started:
                gauge -= 1
        seen.append(gauge)
    return seen


def test_one_run_folds_into_its_last_event_and_the_state_reads_the_same():
    a, b = run_of("a", 1.0, 1), run_of("b", 1.05, 10)
    interleaved = [a[0], b[0], a[1], b[1], a[2], b[2]]
    folded = fold_task_events(interleaved)
    assert [e["type"] for e in folded] == ["task-succeeded", "task-succeeded"]
    assert tasks_seen(folded) == tasks_seen(interleaved)
    assert tasks_seen(folded)["a"]["name"] == "tasks.dispatch"
    assert tasks_seen(folded)["a"]["received"] == 1.0 and tasks_seen(folded)["a"]["started"] == 1.1


def test_a_young_open_run_is_held_for_its_end_and_then_sent_as_one_event():
    a = run_of("a", 1.0, 1)
    send, held = fold_batch(a[:2], hold_after=0.5)
    assert send == [] and held == a[:2]
    send, held = fold_batch([*held, a[2]], hold_after=0.7)
    assert [e["type"] for e in send] == ["task-succeeded"] and held == []
    assert tasks_seen(send) == tasks_seen(a)


def test_an_old_open_run_goes_as_it_is_so_flowers_prefetched_gauge_stays_right():
    a = run_of("a", 1.0, 1)
    send, held = fold_batch(a[:2], hold_after=1.5)
    assert send == a[:2] and held == []
    later, _ = fold_batch([a[2]], hold_after=1.5)
    assert later == [a[2]]  # its started went before: sent, not folded (Flower counts it off the gauge)
    assert prefetched(send + later)[-1] == 0


def test_a_new_delivery_after_an_ending_event_is_never_merged_into_it():
    first = [ev("task-received", "a", 1.0, 1, name="t"), ev("task-retried", "a", 1.2, 2, exception="E()")]
    second = [ev("task-received", "a", 2.0, 3, name="t", retries=1), ev("task-started", "a", 2.1, 4)]
    folded = fold_task_events(first + second)
    assert [e["type"] for e in folded] == ["task-retried", "task-received", "task-started"]
    assert "exception" not in folded[1] and folded[1]["retries"] == 1


def test_a_revoked_task_that_never_started_keeps_its_received():
    events = [ev("task-received", "a", 1.0, 1, name="t"), ev("task-revoked", "a", 1.1, 2)]
    assert fold_task_events(events) == events
    assert prefetched(events)[-1] == 0


def test_events_without_a_task_pass_unchanged_and_in_order():
    other = {"type": "worker-heartbeat", "timestamp": 1.0, "clock": 1}
    a = run_of("a", 1.0, 2)
    folded = fold_task_events([other, *a])
    assert folded[0] is other and len(folded) == 2


ENDS = ("task-succeeded", "task-failed", "task-retried", "task-rejected", "task-revoked")


@st.composite
def worker_streams(draw) -> tuple[list[dict], list[int], float]:
    """Some tasks' events as one worker sends them (each attempt: received, maybe started, an end or
    none for a last one still running), interleaved at random, with flush points and a hold."""
    per_task: list[list[tuple[str, dict]]] = []
    for t in range(draw(st.integers(1, 4))):
        attempts = draw(st.integers(1, 3))
        events: list[tuple[str, dict]] = []
        for n in range(attempts):
            last = n == attempts - 1
            eta = draw(st.sampled_from((None, 50.0 + n))) if n else None  # a retry's countdown
            events.append(("task-received", {"name": f"type.{t}", "args": "()", "kwargs": f"{{'n': {t}}}",
                                             "retries": n, "eta": eta,
                                             "expires": None, "parent_id": None,
                                             "root_id": f"task-{t}"}))
            started = draw(st.booleans())
            if started:
                events.append(("task-started", {}))
            end = draw(st.sampled_from((*ENDS[:2], *ENDS[3:], None) if last else ("task-retried",)))
            if end == "task-succeeded":
                events.append((end, {"result": f"'r{t}'", "runtime": 0.02 * (t + 1)}))
            elif end in ("task-failed", "task-retried"):
                events.append((end, {"exception": f"E({n})", "traceback": None}))
            elif end is not None:
                events.append((end, {}))
        per_task.append(events)
    order = draw(st.permutations([t for t, events in enumerate(per_task) for _ in events]))
    stream, at = [], [0] * len(per_task)
    for i, t in enumerate(order):
        kind, fields = per_task[t][at[t]]
        at[t] += 1
        stream.append(ev(kind, f"task-{t}", 100.0 + 0.01 * i, i + 1, **fields))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=4)))
    return stream, cuts, draw(st.sampled_from((0.0, 0.015, 0.05, 10.0)))


def flushed(stream: list[dict], cuts: list[int], hold: float) -> list[dict]:
    """What a worker publishes for ``stream`` flushed at ``cuts`` (each flush just after its last event)."""
    sent, held, start = [], [], 0
    for cut in [*cuts, len(stream)]:
        batch = [*held, *stream[start:cut]]
        start = cut
        if batch:
            out, held = fold_batch(batch, hold_after=batch[-1]["timestamp"] + 0.001 - hold)
            sent += out
    return sent + fold_task_events(held)  # the last flush: nothing more comes


@given(worker_streams())
@bounded(300)
def test_any_interleaving_folded_reads_the_same_in_celerys_state_and_keeps_flowers_gauge(case):
    stream, cuts, hold = case
    sent = flushed(stream, cuts, hold)
    assert tasks_seen(sent) == tasks_seen(stream)
    assert len(sent) <= len(stream)
    gauge = prefetched(sent)
    assert min(gauge, default=0) >= 0 and gauge[-1] <= prefetched(stream)[-1]


@given(worker_streams())
@bounded(100)
def test_a_batch_holding_every_run_sends_one_event_a_task_that_ended(case):
    stream, _, _ = case
    sent = flushed(stream, [], 0.0)
    ended = [e for e in stream if e["type"] in ENDS]
    started_only_ends = [e for e in ended if e["type"] in ("task-rejected", "task-revoked")]
    opened = {e["uuid"] for e in stream} - {e["uuid"] for e in stream[-1:] if e["type"] in ENDS}
    assert len(sent) <= len(ended) + 2 * len(started_only_ends) + 2 * len(opened)
