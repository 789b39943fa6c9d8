"""What a worker main process asks of Redis per message, counted (never timed).

With ``appendfsync always`` every write's reply waits for Redis's next fsync,
so a worker that pops one message per call, or publishes one event message
per task event, is held to a message or an event per fsync, whatever its
threads (``make run`` completed about 330 tasks/s of the load test's 20 ms
work that way). These count the calls against the messages.
"""

from __future__ import annotations

import threading

from celery import current_app
from django_celery_results.models import TaskResult

from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until

TASKS = 300


def calls(rc, command: str) -> int:
    return int(rc.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def queue_then_drain(start_worker, rc, lane: str, type_name: str, env: dict[str, str] | None = None) -> list[str]:
    ids = []
    for i in range(TASKS):
        result = dispatch.delay(type_name, {"i": i})
        assert result.accepted, result
        ids.append(result.task_id)
    start_worker(lane, pool="threads", concurrency=8, env=env)
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == TASKS, timeout=120,
               what=f"{TASKS} results stored")
    return ids


def test_a_worker_takes_a_backlog_in_far_fewer_pops_than_messages(start_worker, rc):
    lane, type_name = unique("flow"), unique("flow-echo")
    define(type_name, lane=lane)
    before = calls(rc, "brpop")
    queue_then_drain(start_worker, rc, lane, type_name)
    pops = calls(rc, "brpop") - before
    # One BRPOP per message before (300); now each BRPOP that delivers is followed by one call that
    # takes what the prefetch window (8 here) has room for: 2-4 messages a call with no-op tasks (103 BRPOPs
    # measured). Idle BRPOPs (1 s timeout) add a few.
    assert pops <= TASKS // 2, f"{pops} BRPOP calls for {TASKS} messages"


def test_task_events_reach_an_event_receiver_whole_in_few_messages(start_worker, rc):
    lane, type_name = unique("flow-ev"), unique("flow-ev-echo")
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
        before = calls(rc, "publish")
        try:
            ids = queue_then_drain(start_worker, rc, lane, type_name, env={"CELERY_WORKER_SEND_TASK_EVENTS": "true"})

            def all_seen() -> bool:
                with lock:
                    return sum(1 for t in ids if (task := state.tasks.get(t)) and task.state == "SUCCESS") == TASKS

            wait_until(all_seen, timeout=30, what="every task seen by the receiver as SUCCESS")
            publishes = calls(rc, "publish") - before
        finally:
            receiver.should_stop = True
            thread.join(timeout=10)
    with lock:
        tasks = [state.tasks[t] for t in ids]
    # What Flower lists for each task: its name and arguments (from the received event), when it
    # was received and started, and how long it ran, all there although events were folded.
    assert all(t.name and t.kwargs and t.received and t.started and t.runtime is not None for t in tasks), \
        [vars(t) for t in tasks if not (t.name and t.received and t.started)][:3]
    # Three events per task, one PUBLISH per event loop turn before (about one per event under
    # load); now a batch per 0.1 s. Worker heartbeats publish too (one per 2 s).
    assert publishes <= TASKS // 5, f"{publishes} PUBLISH calls for {TASKS} tasks ({3 * TASKS} events)"


def test_a_lane_that_keeps_up_does_not_pay_for_looking_for_more(start_worker, rc):
    lane, type_name = unique("flow-idle"), unique("flow-idle-echo")
    define(type_name, lane=lane)
    start_worker(lane, pool="threads", concurrency=8)
    dispatch.delay(type_name, {"warm": True}).get(timeout=60)
    before = calls(rc, "rpop")
    n = 40
    for i in range(n):
        dispatch.delay(type_name, {"i": i}).get(timeout=60)  # one at a time: nothing more is ever waiting
    rpops = calls(rc, "rpop") - before
    # Looking for more after each pop would cost an RPOP per priority list (10) per task: 400 here.
    # After a look that found nothing, the next ones are skipped (1, 2, 4, ... up to 16 pops).
    assert rpops <= n * 3, f"{rpops} RPOP calls for {n} tasks taken one at a time"
