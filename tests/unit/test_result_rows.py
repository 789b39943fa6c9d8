"""A group's result rows (``UpsertBackend.result_rows``: what every row of a group shares looked up or encoded
once) are, row by row, what ``result_row`` makes of each outcome alone."""

from __future__ import annotations

import pytest
from celery import current_app, states
from hypothesis import given, settings

from tasks import history
from tasks.grouping import request_context
from tasks.results import RowTerms, UpsertBackend
from tests.unit.test_jsontext import kombu_values


def _request(n: int, **extra):
    request = request_context(id=f"t-{n}", task="demo.echo", argsrepr="()", kwargsrepr=f"{{payload: {{'n': {n}}}}}",
                              shadow="chat.send", hostname="w@h", children=[], timelimit=None, retries=0,
                              delivery_info={"exchange": "", "routing_key": "l"}, is_eager=False)
    for name, value in extra.items():
        setattr(request, name, value)
    return request


@pytest.mark.parametrize("extended", [True, False])
def test_a_groups_rows_are_each_what_result_row_makes(monkeypatch, extended):
    backend = current_app.backend
    assert isinstance(backend, UpsertBackend)
    monkeypatch.setitem(current_app.conf, "result_extended", extended)
    outcomes = [
        ("t-1", {"ok": 1}, states.SUCCESS, _request(1), ""),
        ("t-2", None, states.SUCCESS, _request(2, shadow=None), '[["started", 1.5]]'),
        ("t-3", backend.encode_result(ValueError("no"), states.FAILURE), states.FAILURE, _request(3), ""),
        ("t-4", "x", states.SUCCESS, _request(4, meta={"k": "v"}, argsrepr="(1,)"), '[["started", 2.5]]'),
        ("t-5", [1, 2], states.RETRY, _request(5, argsrepr=None, args=[1], kwargsrepr=None, kwargs={"a": 1},
                                               periodic_task_name="nightly"), ""),
    ]
    alone = [backend.result_row(task_id, result, state, None, request, events=events)[0]
             for task_id, result, state, request, events in outcomes]
    assert backend.result_rows(outcomes) == alone
    # A group runner reads the terms once (RowTerms.of) and passes them: the same rows.
    terms = RowTerms.of(backend)
    assert terms == RowTerms(extended, history.rows_outlive_history())
    assert backend.result_rows(outcomes, terms.extended) == alone
    assert backend.result_rows(outcomes, not extended) != alone  # the term passed is the one used


def _celery_encoding(value):
    """The reference: Celery's backend encoding as kombu's registry writes it (``Backend._encode``)."""
    from kombu.serialization import dumps

    try:
        return "ok", dumps(value, serializer="json")
    except Exception as exc:  # noqa: BLE001 - the refusal itself is compared
        return "error", type(exc).__name__


def _ours(backend, value):
    try:
        return "ok", backend._encode(value)
    except Exception as exc:  # noqa: BLE001
        return "error", type(exc).__name__


@settings(max_examples=300, deadline=None)
@given(value=kombu_values)
def test_the_backends_encoding_is_celerys(value):
    backend = current_app.backend
    assert backend.serializer == "json"
    assert _ours(backend, value) == _celery_encoding(value)


def test_another_json_encoder_registered_is_the_one_used(monkeypatch):
    """A project that registers its own ``json`` encoder gets its text, not the shortcut's."""
    from kombu.serialization import registry

    backend = current_app.backend
    assert backend._encode({"a": 1})[2] == '{"a": 1}'
    monkeypatch.setitem(registry._encoders, "json", registry._encoders["json"]._replace(encoder=lambda v: "custom"))
    assert backend._encode({"a": 1})[2] == "custom"
