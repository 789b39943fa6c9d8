"""Folding a worker's task events per run: what Flower's event state records must not change."""

from __future__ import annotations

from celery.events.state import State

from tasks.worker_events import fold_task_events


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
    keep = ("state", "name", "args", "kwargs", "result", "runtime", "received", "started", "succeeded", "retries")
    return {uuid: {k: getattr(task, k) for k in keep} for uuid, task in state.tasks.items()}


def test_one_run_folds_into_its_last_event_and_the_state_reads_the_same():
    a, b = run_of("a", 1.0, 1), run_of("b", 1.05, 10)
    interleaved = [a[0], b[0], a[1], b[1], a[2], b[2]]
    folded = fold_task_events(interleaved)
    assert [e["type"] for e in folded] == ["task-succeeded", "task-succeeded"]
    assert tasks_seen(folded) == tasks_seen(interleaved)
    assert tasks_seen(folded)["a"]["name"] == "tasks.dispatch"
    assert tasks_seen(folded)["a"]["received"] == 1.0 and tasks_seen(folded)["a"]["started"] == 1.1


def test_a_run_still_open_is_folded_as_far_as_it_got():
    a = run_of("a", 1.0, 1)
    folded = fold_task_events(a[:2])
    assert [e["type"] for e in folded] == ["task-started"]
    assert folded[0]["name"] == "tasks.dispatch" and folded[0]["received"] == 1.0
    assert tasks_seen(folded) == tasks_seen(a[:2])


def test_a_new_delivery_after_an_ending_event_is_never_merged_into_it():
    first = [ev("task-received", "a", 1.0, 1, name="t"), ev("task-retried", "a", 1.2, 2, exception="E()")]
    second = [ev("task-received", "a", 2.0, 3, name="t", retries=1), ev("task-started", "a", 2.1, 4)]
    folded = fold_task_events(first + second)
    assert [e["type"] for e in folded] == ["task-retried", "task-started"]
    assert "exception" not in folded[1] and folded[1]["retries"] == 1


def test_events_without_a_task_pass_unchanged_and_in_order():
    other = {"type": "worker-heartbeat", "timestamp": 1.0, "clock": 1}
    a = run_of("a", 1.0, 2)
    folded = fold_task_events([other, *a])
    assert folded[0] is other and len(folded) == 2
