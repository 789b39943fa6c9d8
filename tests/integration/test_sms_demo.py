"""The SMS demo (seed 004, issue 16): every message accounted for, batched and not, through throttling."""

from __future__ import annotations

import time

import pytest

from tasks import config
from tasks.context import Context
from tasks.dispatch import admit
from tasks.models import DeadLetter
from tests.support.helpers import define, unique, wait_until
from tools.models import SmsMessage
from tools.sms_demo import submit_one
from tools.sms_supplier import Supplier, SupplierServer


@pytest.fixture
def supplier():
    with SupplierServer(Supplier(tps=200, latency_ms=10)) as server:
        yield server


@pytest.mark.parametrize("handler", ["sms.submit", "sms.submit_one"])
def test_every_message_is_submitted_once_and_has_its_row(start_worker, supplier, handler):
    lane = unique("sms")
    name = unique("sms")
    define(name, handler=handler, lane=lane, options={"url": supplier.url}, batch_size=64, batch_window_ms=5,
           policy={"max_retries": 50, "initial_backoff": 0.1, "max_backoff": 0.5})
    config.forget()
    n, channels = 300, 3
    sent = [admit(name, {"to": f"+86138{i:08d}", "channel": f"ch{i % channels}", "text": "hello"},
                  idempotency_key=f"{name}-{i}") for i in range(n)]
    bad = admit(name, {"to": "not a number", "channel": "ch0"}, idempotency_key=f"{name}-bad")
    assert all(r.accepted for r in sent) and bad.accepted
    start_worker(lane, pool="threads", concurrency=4)
    for r in sent:
        assert "submit_id" in r.get(timeout=120)
    wait_until(lambda: DeadLetter.objects.filter(task_id=bad.task_id, reason="non_retryable").exists(), timeout=30,
               what="the bad number's dead letter")
    rows = SmsMessage.objects.filter(key__startswith=f"{name}-")
    assert rows.count() == n  # one row per accepted message
    stats = supplier.supplier.stats()
    assert stats["accepted"] == n and stats["rejected"] == 1  # each submitted once
    if handler == "sms.submit":
        assert stats["requests"] < n  # one request carried many messages
    assert {r.task_id for r in sent} == set(rows.values_list("task_id", flat=True))


def test_a_worker_killed_mid_batch_submits_nothing_twice(start_worker):
    with SupplierServer(Supplier(tps=1000, latency_ms=150)) as supplier:
        lane = unique("sms")
        name = unique("sms")
        define(name, handler="sms.submit", lane=lane, options={"url": supplier.url}, batch_size=20,
               batch_window_ms=0)
        config.forget()
        n = 100
        sent = [admit(name, {"to": f"+86139{i:08d}", "channel": f"ch{i % 2}"}, idempotency_key=f"{name}-{i}")
                for i in range(n)]
        victim = start_worker(lane, pool="prefork", concurrency=1)
        wait_until(lambda: supplier.supplier.stats()["accepted"] >= 10, timeout=60, what="a batch submitted")
        victim.kill()
        start_worker(lane, pool="prefork", concurrency=1)
        for r in sent:
            assert "submit_id" in r.get(timeout=120)
        stats = supplier.supplier.stats()
        # Each message submitted once; a re-send after the kill was answered from the
        # supplier's facts (a duplicate, same submit id), and its row written then.
        assert stats["accepted"] == n
        rows = dict(SmsMessage.objects.filter(key__startswith=f"{name}-").values_list("key", "submit_id"))
        assert len(rows) == n
        assert all(r.get(timeout=1)["submit_id"] == rows[f"{name}-{i}"] for i, r in enumerate(sent))


def _ctx(url: str, key: str) -> Context:
    now = time.time()
    return Context(task_id=unique("t"), type="sms", lane="sms", chat_id="", attempt=1, deadline=now + 30,
                   attempt_deadline=now + 10, idempotency_key=key, options={"url": url})


class _Counted:
    """Statements run and transactions committed or rolled back on the default connection (this thread's)."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.transactions = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements.append(sql.split(None, 1)[0].upper())
        return execute(sql, params, many, context)


@pytest.fixture
def counted(monkeypatch):
    from django.db import connections

    connection = connections["default"]
    counts = _Counted()
    for name in ("_commit", "_rollback"):
        original = getattr(connection, name)

        def wrapped(_original=original):
            counts.transactions += 1
            return _original()

        monkeypatch.setattr(connection, name, wrapped)
    with connection.execute_wrapper(counts):
        yield counts


def test_the_unbatched_twin_is_two_statements_a_message_and_no_transaction_of_its_own(supplier, counted):
    # sms.submit_one as a plain handler: its row's SELECT, the request, the INSERT, each statement its own
    # transaction in autocommit. Run as submit_many's batch of one it was a BEGIN, the INSERT and a COMMIT
    # for its row (bulk_create's atomic block): on PostgreSQL four round trips a message instead of two.
    key = unique("sms-one")
    out = submit_one({"to": "+8613800000001", "channel": "ch0", "text": "hi"}, _ctx(supplier.url, key))
    assert counted.statements == ["SELECT", "INSERT"] and counted.transactions == 0, vars(counted)
    assert SmsMessage.objects.get(key=key).submit_id == out["submit_id"]
    # Sent again (a retry after the row was written): answered from the row, no request, one statement.
    requests = supplier.supplier.stats()["requests"]
    counted.statements.clear()
    assert submit_one({"to": "+8613800000001", "channel": "ch0"}, _ctx(supplier.url, key)) == out
    assert counted.statements == ["SELECT"] and supplier.supplier.stats()["requests"] == requests


def test_the_unbatched_twin_keeps_the_row_an_earlier_attempt_wrote(supplier, monkeypatch):
    # The supplier accepted, the row appeared between this attempt's SELECT and its INSERT (another
    # attempt's): the INSERT's conflict is not an error, the answer is the supplier's same submit id.
    from tools import sms_demo

    key = unique("sms-race")
    first = submit_one({"to": "+8613800000002", "channel": "ch0"}, _ctx(supplier.url, key))
    real_filter = SmsMessage.objects.filter
    monkeypatch.setattr(SmsMessage.objects, "filter", lambda **kw: real_filter(pk=-1) if "key" in kw else
                        real_filter(**kw))
    again = sms_demo.submit_one({"to": "+8613800000002", "channel": "ch0"}, _ctx(supplier.url, key))
    monkeypatch.undo()
    assert again == first and SmsMessage.objects.filter(key=key).count() == 1
    assert supplier.supplier.stats()["duplicates"] == 1  # it was sent again, and answered as a re-send
