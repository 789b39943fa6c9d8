"""Property: whatever JSON (or not-JSON) a caller sends, the API answers JSON, never a 500 or HTML."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique

#: Any code point, lone surrogates, NUL and controls included (JSON can carry them as \u escapes).
ANY_CHAR = st.characters(codec=None, categories=None, exclude_categories=[])
TEXT = st.text(ANY_CHAR, max_size=20)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(ANY_CHAR, max_size=10), inner, max_size=4), max_leaves=12)
FIELDS = ("task_type", "payload", "chat_id", "priority", "idempotency_key", "timeout", "metadata", "items",
          "countdown", "eta", "retry_policy")


@pytest.fixture(scope="module")
def door():
    name = unique("api-prop")
    define(name, handler="demo.echo", lane="t-api-prop", chat_scoped=False)
    return name, ApiClient(make_token(unique("svc-prop"), [name], rate_per_s=1_000_000))


def _shaped(task_type: str):
    """Bodies near the real shape (so they get past the first check), with any values in any field."""
    return st.fixed_dictionaries(
        {"task_type": st.just(task_type) | st.text(ANY_CHAR, max_size=12)},
        optional={f: JSON for f in FIELDS if f != "task_type"}
        | {"payload": st.dictionaries(st.text(ANY_CHAR, max_size=8), JSON, max_size=3)},
    )


def _check(response) -> None:
    assert response.status_code != 500 and response.status_code < 600, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response.content[:300]
    body = json.loads(response.content)
    assert {"reason", "accepted", "results", "state"} & set(body), body


@settings(max_examples=int(os.environ.get("API_PROPERTY_EXAMPLES", "120")), deadline=None,
          derandomize=bool(os.environ.get("CI")), suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(data=st.data())
def test_any_body_gets_a_json_answer_never_a_500(door, data):
    task_type, client = door
    body = data.draw(JSON | _shaped(task_type), label="body")
    path = data.draw(st.sampled_from(["/dispatch", "/dispatch/bulk"]), label="path")
    if path.endswith("bulk") and isinstance(body, dict) and data.draw(st.booleans(), label="as bulk"):
        body = {"task_type": body.pop("task_type", task_type), "items": [body.get("payload", body)], **{
            k: v for k, v in body.items() if k in ("priority", "timeout", "metadata")}}
    _check(client.post(path, raw=json.dumps(body)))


@settings(max_examples=40, deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture], database=None)
@given(raw=st.binary(max_size=64) | st.text(ANY_CHAR, max_size=64).map(lambda s: s.encode("utf-8", "surrogatepass")),
       task_id=st.text(ANY_CHAR, min_size=1, max_size=80).filter(lambda s: not {"/", "?", "#"} & set(s)))
def test_any_bytes_and_any_task_id_get_a_json_answer(door, raw, task_id):
    from urllib.parse import quote

    _, client = door
    _check(client.post("/dispatch", raw=raw))
    _check(client.get("/tasks/" + quote(task_id, safe="", errors="surrogatepass")))
