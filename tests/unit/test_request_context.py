"""A grouped task's Celery request (``tasks.grouping.request_context``) is what Celery's ``Context`` makes of
the same fields, without its per-call scan for custom headers."""

from __future__ import annotations

import pytest
from celery.app.task import Context

from tasks.grouping import request_context


@pytest.mark.parametrize("timelimit", [None, [30, 25]])
def test_the_request_is_celerys_context_of_the_same_fields(timelimit):
    fields = dict(id="t-1", task="demo.echo", argsrepr="()", kwargsrepr="{payload: {}}", shadow="chat.send",
                  hostname="w@h", children=[], timelimit=timelimit, retries=2,
                  delivery_info={"exchange": "", "routing_key": "l"}, is_eager=False)
    celerys = Context(**fields, periodic_task_name=None, meta={}, dispatch_settle=None)
    ours = request_context(**fields)
    assert type(ours) is Context
    assert vars(ours) == vars(celerys)
    assert ours.headers == {"periodic_task_name": None, "meta": {}, "dispatch_settle": None}
    assert ours.headers["meta"] is ours.meta  # one dict, as Celery's copy of the fields holds it
