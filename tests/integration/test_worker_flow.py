"""What a worker main process asks of Redis per message, counted (never timed).

With ``appendfsync always`` every write's reply waits for Redis's next fsync,
so a worker that pops one message per call, or publishes one event message
per task event, is held to a message or an event per fsync, whatever its
threads (``make run`` completed about 330 tasks/s of the load test's 20 ms
work that way). These count the calls against the messages.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from celery import current_app
from django_celery_results.models import TaskResult

from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until
from tests.support.workers import Worker

TASKS = 300


def calls(rc, command: str) -> int:
    return int(rc.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.fixture(scope="module")
def drained(redis_server, tmp_root):
    """One threads worker (task events on) drains a backlog of TASKS queued before it started.

    Yields what the three tests read: Redis calls counted over the drain, the tasks as an event
    receiver saw them, and the worker's lane and type, still served, for the last test.
    """
    rc = redis_server.client()
    lane, type_name = unique("flow"), unique("flow-echo")
    define(type_name, lane=lane)
    app = current_app
    state = app.events.State()
    lock = threading.Lock()

    def on_event(event: dict) -> None:
        with lock:
            state.event(event)

    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": on_event})
        thread = threading.Thread(target=lambda: receiver.capture(limit=None, timeout=None, wakeup=False),
                                  daemon=True)
        thread.start()  # subscribed long before the worker below is ready and sends its first event
        worker = None
        try:
            ids = []
            for i in range(TASKS):
                result = dispatch.delay(type_name, {"i": i})
                assert result.accepted, result
                ids.append(result.task_id)
            before = {c: calls(rc, c) for c in ("brpop", "rpop", "publish")}
            worker = Worker(lane, tmp_root / "logs", pool="threads", concurrency=8,
                            env={"CELERY_WORKER_SEND_TASK_EVENTS": "true"}).start()
            wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == TASKS,
                       timeout=120, what=f"{TASKS} results stored")
            pops = calls(rc, "brpop") - before["brpop"]
            takes = calls(rc, "rpop") - before["rpop"]

            def all_seen() -> bool:
                with lock:
                    return sum(1 for t in ids if (task := state.tasks.get(t)) and task.state == "SUCCESS") == TASKS

            wait_until(all_seen, timeout=30, what="every task seen by the receiver as SUCCESS")
            publishes = calls(rc, "publish") - before["publish"]
        finally:
            receiver.should_stop = True
            thread.join(timeout=10)
        with lock:
            tasks = [state.tasks[t] for t in ids]
        try:
            yield SimpleNamespace(pops=pops, takes=takes, publishes=publishes, tasks=tasks, lane=lane,
                                  type_name=type_name)
        finally:
            if worker is not None:
                worker.stop(timeout=20)


def test_a_worker_takes_a_backlog_in_far_fewer_pops_than_messages(drained):
    # One BRPOP per message before issue 15 (301 for 300). Since the doorbells a worker's BRPOP
    # returns a lane's doorbell token and is followed by one POP_MORE call that takes what the
    # prefetch window (8 here) has room for, with one RPOP per priority list that holds messages
    # (the backlog here is one list): a pop is a BRPOP and a POP_MORE call, a few messages each.
    # Idle BRPOPs (1 s timeout, each followed by a look at the lane's lists) add a few.
    assert drained.pops <= TASKS // 2, f"{drained.pops} BRPOP calls for {TASKS} messages"
    assert drained.takes <= TASKS // 2, f"{drained.takes} RPOP calls (POP_MORE's) for {TASKS} messages"


def test_task_events_reach_an_event_receiver_whole_in_few_messages(drained):
    # What Flower lists for each task: its name and arguments (from the received event), when it
    # was received and started, and how long it ran, all there although events were folded.
    tasks = drained.tasks
    assert all(t.name and t.kwargs and t.received and t.started and t.runtime is not None for t in tasks), \
        [vars(t) for t in tasks if not (t.name and t.received and t.started)][:3]
    # Three events per task, one PUBLISH per event loop turn before (587 for 300 tasks); now a
    # batch per 0.1 s. Worker heartbeats publish too (one per 2 s).
    assert drained.publishes <= TASKS // 5, f"{drained.publishes} PUBLISH calls for {TASKS} tasks"


def test_a_lane_that_keeps_up_does_not_pay_for_looking_for_more(drained, rc):
    dispatch.delay(drained.type_name, {"warm": True}).get(timeout=60)
    before = calls(rc, "rpop")
    n = 40
    for i in range(n):
        dispatch.delay(drained.type_name, {"i": i}).get(timeout=60)  # one at a time: nothing more is waiting
    rpops = calls(rc, "rpop") - before
    # Looking at every priority list on each pop would cost an RPOP per list (10) per task: 400
    # here. A doorbell token names the lists pushed since it was rung, so a pop looks at one list;
    # the look at every list (each BRPOP timeout, and at least once a second) asks EXISTS first.
    assert rpops <= n * 2, f"{rpops} RPOP calls for {n} tasks taken one at a time"
