"""``TaskType.store_result``: which outcomes get a result row; ``DispatchResult.get`` works in every mode.

Real thread workers (the grouped path, tasks.grouping) and a prefork one (Celery's own request path,
the result backend): the rows a type keeps, counted, and the outcome each caller waits for.
"""

from __future__ import annotations

import pytest
from django_celery_results.models import TaskResult

from lanes import keys
from tasks.dispatch import dispatch
from tasks.errors import DeadLettered
from tests.support.helpers import define, unique, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


POOLS, MODES = ["threads", "prefork"], ["always", "failures", "never"]
#: A lane per case; one worker per pool serves its three (``pool_lanes``).
LANES = {(pool, mode): unique("sr") for pool in POOLS for mode in MODES}


@pytest.fixture(scope="module")
def pool_lanes(module_workers) -> dict:
    for pool in POOLS:
        module_workers(",".join(lane for (p, _), lane in LANES.items() if p == pool), pool=pool, concurrency=2)
    return LANES


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("mode", MODES)
def test_a_type_keeps_the_rows_it_asks_for_and_get_works_in_every_mode(pool_lanes, rc, pool, mode):
    lane, name = pool_lanes[(pool, mode)], unique(f"sr-{mode}")
    define(name, lane=lane, handler="demo.flaky", store_result=mode, policy={"max_retries": 0})
    ok = [dispatch.delay(name, {"n": n}) for n in range(5)]
    bad = dispatch.delay(name, {"fail": "fatal"})
    assert [r.get(timeout=60) for r in ok] == [{"n": n} for n in range(5)]
    with pytest.raises(DeadLettered):
        bad.get(timeout=60)
    ids = [r.task_id for r in ok]
    if mode == "always":
        wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == 5, timeout=10,
                   what="a row for every success")
    if mode in ("always", "failures"):
        wait_until(lambda: TaskResult.objects.filter(task_id=bad.task_id, status="FAILURE").exists(), timeout=10,
                   what="the failure's row")
    # Every record settled (a task whose outcome keeps no row is settled without one).
    records = [keys.task_record(t) for t in [*ids, bad.task_id]]
    wait_until(lambda: rc.exists(*records) == 0, timeout=20, what="every record settled")
    if mode != "always":
        assert not TaskResult.objects.filter(task_id__in=ids).exists()
    if mode == "never":
        assert not TaskResult.objects.filter(task_id=bad.task_id).exists()


def test_a_get_that_waits_in_redis_is_answered_by_the_row_when_no_tombstone_was_written(pool_lanes, rc):
    """A caller that dispatched while its type kept no row waits in Redis; if the type keeps rows by the
    time the task ends, the grouped finish writes no tombstone (the row answers), so the row must."""
    from tasks import results

    name = unique("sr-switch")
    define(name, lane=pool_lanes[("threads", "always")], handler="demo.flaky", store_result="always")
    done = dispatch.delay(name, {"n": 7})
    assert done.get(timeout=60) == {"n": 7}
    wait_until(lambda: rc.exists(keys.task_record(done.task_id)) == 0, timeout=20, what="the record settled")
    assert rc.get(keys.tombstone(done.task_id)) is None  # the success kept its row, not a tombstone
    assert results.outcome_from_redis(done.task_id, timeout=5, propagate=True, interval=0.1,
                                      failures_have_rows=True) == {"n": 7}
