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


# --- a second caller: nothing one token does changes what another reads, admits or is refused -----------

NAMES = st.sampled_from(["c1", "c2", "k1", "order-1"])
#: One action of a caller: (verb, chat id, idempotency key, payload value / target index, countdown).
ACTION = st.tuples(st.sampled_from(["dispatch", "bulk", "read", "cancel"]), NAMES, st.none() | NAMES,
                   st.integers(0, 2), st.sampled_from([None, 20.0]))


@pytest.fixture(scope="module")
def rooms():
    """Two worlds alike: in each, token A on its own chat type; in the mixed one, token B on that type too."""
    worlds = {}
    for world in ("alone", "mixed"):
        name, lane, token = unique(f"api-room-{world}"), unique(f"t-room-{world}"), unique(f"svc-a-{world}")
        define(name, handler="demo.echo", lane=lane, chat_scoped=True, chat_queue_size=3, timeout=30)
        worlds[world] = (name, ApiClient(make_token(token, [name], rate_per_s=1_000_000)), (name, lane, token))
    intruder = ApiClient(make_token(unique("svc-b"), [worlds["mixed"][0]], rate_per_s=1_000_000))
    return worlds, intruder


def _act(client, task_type, action, salt, ids, targets):
    """Run one action; its answer as text, this caller's own task ids (``ids``) appended as they are made."""
    verb, chat, key, value, countdown = action
    item = {"payload": {"v": value}, "chat_id": salt + chat, **({"idempotency_key": salt + key} if key else {})}
    if verb == "dispatch":
        r = client.post("/dispatch", {"task_type": task_type, **item, "countdown": countdown})
    elif verb == "bulk":
        r = client.post("/dispatch/bulk", {"task_type": task_type, "items": [item, item], "countdown": countdown})
    else:
        target = targets[value % len(targets)] if targets else "tk0-none"
        r = client.get(f"/tasks/{target}") if verb == "read" else client.post(f"/tasks/{target}/cancel")
    body = json.loads(r.content)
    for res in body.get("results", [body]):
        if res.get("accepted") and res["task_id"] not in ids:
            ids.append(res["task_id"])
    return json.dumps([r.status_code, {k: v for k, v in body.items() if k not in ("estimated_delay", "date_done")}])


def _normal(text: str, ids: list[str], names: tuple[str, ...]) -> str:
    """The answer with what differs between the worlds by construction (ids, type, lane, token) as placeholders."""
    for index, task_id in enumerate(ids):
        text = text.replace(task_id, f"<task {index}>")
    for index, name in enumerate(names):
        text = text.replace(name, f"<name {index}>")
    return text


@settings(max_examples=int(os.environ.get("API_PROPERTY_EXAMPLES", "25")), deadline=None,
          derandomize=bool(os.environ.get("CI")), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mine=st.lists(ACTION, min_size=1, max_size=6), theirs=st.lists(ACTION, max_size=8),
       order=st.randoms(use_true_random=False))
def test_another_token_changes_nothing_this_token_reads_admits_or_is_refused(rooms, mine, theirs, order):
    """B uses the same chat ids and keys on the same type, reads and cancels A's ids: A sees what it sees alone."""
    worlds, intruder = rooms
    salt = unique("s") + "-"
    answers = {}
    for world, (task_type, client, names) in worlds.items():
        ids: list[str] = []
        their_ids: list[str] = []
        steps = [("a", a) for a in mine]
        if world == "mixed":
            steps += [("b", b) for b in theirs]
            order.shuffle(steps)
            a_steps = iter(  # A's steps keep their own order; B's go wherever the shuffle put them
                ("a", a) for a in mine)
            steps = [next(a_steps) if who == "a" else (who, act) for who, act in steps]
        got = []
        for who, action in steps:
            if who == "a":
                got.append(_act(client, task_type, action, salt, ids, ids))
            else:
                _act(intruder, task_type, action, salt, their_ids, ids + their_ids)
        answers[world] = [_normal(text, ids, names) for text in got]
    assert answers["mixed"] == answers["alone"]


# --- a token's share of a lane: at its share it is refused, another token is not ----------------------

#: One step: (who, how many items, whether A cancels one of its waiting tasks first).
SHARE_STEP = st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 4), st.booleans())


@pytest.fixture(scope="module")
def sharers():
    """Token A with a share of each lane it uses, token B with the whole lane (the default)."""
    name = unique("api-share")
    define(name, handler="demo.echo", lane=unique("t-share-prop"), capacity=10, timeout=300)
    a_name = unique("svc-share-a")
    a = make_token(a_name, [name], rate_per_s=1_000_000, lane_share=10)
    b = make_token(unique("svc-share-b"), [name], rate_per_s=1_000_000)
    return name, a_name, ApiClient(a), ApiClient(b)


@settings(max_examples=int(os.environ.get("API_PROPERTY_EXAMPLES", "15")), deadline=None,
          derandomize=bool(os.environ.get("CI")), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(3, 30), share=st.integers(1, 100), steps=st.lists(SHARE_STEP, min_size=1, max_size=10))
def test_a_token_at_its_share_is_refused_and_another_token_is_not(sharers, capacity, share, steps):
    """Every item's answer is the model's: refused ``lane_full`` at the capacity, else ``caller_quota`` for A at
    its share (at least one task), else admitted; cancelling one of A's waiting tasks gives its room back."""
    from api.models import ServiceToken

    name, a_name, a, b = sharers
    define(name, handler="demo.echo", lane=unique("t-share-ex"), capacity=capacity, timeout=300)  # a fresh lane
    ServiceToken.objects.filter(name=a_name).update(lane_share=share)  # read per request
    quota = max(1, capacity * share // 100)
    depth, held, mine = 0, 0, []
    for who, count, cancel in steps:
        if cancel and mine:
            assert a.post(f"/tasks/{mine.pop()}/cancel").status_code == 200
            depth, held = depth - 1, held - 1
        client = a if who == "a" else b
        items = [{"n": n} for n in range(count)]
        answers = (json.loads(client.post("/dispatch/bulk", {"task_type": name, "items": items}).content)["results"]
                   if count > 1 else [json.loads(client.post("/dispatch", {"task_type": name, "payload": items[0]})
                                                 .content)])
        for answer in answers:
            expected = ("lane_full" if depth >= capacity else
                        "caller_quota" if who == "a" and held >= quota and share < 100 else None)
            assert answer.get("reason") == expected, (who, depth, held, quota, answer)
            if expected is None:
                depth += 1
                if who == "a":
                    held += 1
                    mine.append(answer["task_id"])
