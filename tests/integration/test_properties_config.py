"""Property tests of config import (issue 12): ``apply_config`` is all or nothing and names the bad entry.

Documents are generated valid, then (usually) broken in one place: a wrong type, a missing
field, an unknown key, a huge number, NUL or a lone surrogate in a name or text, a reserved
lane name, a reference to a missing policy or lane, a duplicate name. Properties:

- ``apply_config`` either applies or raises ``ConfigError``, never anything else;
- after an error the database is exactly as before (export and revision compared);
- the error names the broken entry: ``section[index] 'name': field ...``;
- a valid document applies, and ``export_config`` gives back what it said (round trip).
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta

from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.support.hypothesis_profile import bounded

CONFIG_EXAMPLES = 25
_counter = itertools.count()

clean_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)
finite = {"allow_nan": False, "allow_infinity": False}


@st.composite
def policies(draw, name: str) -> dict:
    initial = draw(st.floats(0, 86400, **finite))
    return {"name": name, "max_retries": draw(st.integers(0, 100)), "initial_backoff": initial,
            "multiplier": draw(st.floats(1, 100, **finite)), "max_backoff": draw(st.floats(initial, 86400, **finite)),
            "jitter": draw(st.floats(0, 1, **finite))}


@st.composite
def lanes(draw, name: str) -> dict:
    return {"name": name, "capacity": draw(st.integers(1, 2**31 - 1)), "accepting": draw(st.booleans()),
            "description": draw(clean_text)}


@st.composite
def task_types(draw, name: str, lane: str, policy: str) -> dict:
    from tasks.retry import MAX_TIMEOUT_S

    timeout = draw(st.floats(0.001, MAX_TIMEOUT_S, **finite))
    dedupe = draw(st.sampled_from(["key", "throttle", "debounce"]))
    if dedupe == "debounce":  # its window delays each task: below the timeout
        window = min(timeout * draw(st.floats(0.01, 0.99, **finite)), 86400.0)
    else:
        window = draw(st.floats(0.0 if dedupe == "key" else 0.001, 86400, **finite))
    return {"name": name, "dedupe": dedupe, "dedupe_window": window,
            "lane": lane, "retry_policy": policy, "handler": "demo.echo",
            "priority": draw(st.integers(0, 9)), "timeout": timeout,
            "attempt_timeout": draw(st.floats(0.001, timeout, **finite)), "chat_scoped": draw(st.booleans()),
            "chat_queue_size": draw(st.integers(1, 100000)), "max_payload_bytes": draw(st.integers(2, 8 * 1024 * 1024)),
            "idempotency_window": draw(st.integers(0, 2**31 - 1)), "enabled": draw(st.booleans()),
            "options": draw(st.dictionaries(clean_text, st.integers() | clean_text, max_size=3))}


@st.composite
def schedules(draw, name: str, task_type: dict) -> dict:
    when = draw(st.sampled_from(["interval", "crontab", "clocked"]))
    entry = {"name": name, "task_type": task_type["name"],
             "payload": draw(st.dictionaries(st.text("abc", max_size=3), st.integers(0, 9), max_size=2))
             if task_type["max_payload_bytes"] >= 64 else {},
             "chat_id": "c1" if task_type["chat_scoped"] else draw(st.sampled_from(["", "c2"])),
             "limit_key": draw(st.sampled_from(["", "k1"])), "priority": draw(st.none() | st.integers(0, 9)),
             "missed": draw(st.sampled_from(["once", "skip"])), "enabled": draw(st.booleans())}
    if when == "interval":
        entry["interval"] = {"every": draw(st.integers(1, 10**6)),
                             "period": draw(st.sampled_from(["seconds", "minutes", "hours", "days"]))}
    elif when == "crontab":
        entry["crontab"] = {"minute": str(draw(st.integers(0, 59))), "hour": draw(st.sampled_from(["*", "9", "8-17"])),
                            "day_of_week": draw(st.sampled_from(["*", "1-5", "0"])), "day_of_month": "*",
                            "month_of_year": "*", "timezone": draw(st.sampled_from(["UTC", "Europe/Berlin"]))}
    else:
        moment = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=draw(st.integers(0, 10**8)))
        entry["clocked"] = moment.isoformat()
    return entry


@st.composite
def documents(draw) -> dict:
    """A valid document whose names are new (a fresh prefix per example)."""
    prefix = f"hp{next(_counter)}x{draw(st.integers(0, 10**6))}"
    n_pol, n_lane, n_type = draw(st.integers(0, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 3))
    pols = [draw(policies(f"{prefix}-p{i}")) for i in range(n_pol)]
    lns = [draw(lanes(f"{prefix}-l{i}")) for i in range(n_lane)]
    types = []
    if lns:
        pols = pols or [draw(policies(f"{prefix}-p0"))]
        for i in range(n_type):
            lane = draw(st.sampled_from(lns))["name"]
            policy = draw(st.sampled_from(pols))["name"]
            types.append(draw(task_types(f"{prefix}.t{i}", lane, policy)))
    if not types:
        return {"retry_policies": pols, "lanes": lns, "task_types": types}
    from tasks.models import MIN_SCHEDULE_KEY_WINDOW_S

    keeping = [t for t in types if t["idempotency_window"] >= MIN_SCHEDULE_KEY_WINDOW_S]  # a schedulable type
    scheds = [draw(schedules(f"{prefix}-s{i}", draw(st.sampled_from(keeping))))
              for i in range(draw(st.integers(0, 2)) if keeping else 0)]
    return {"retry_policies": pols, "lanes": lns, "task_types": types, "schedules": scheds}


BAD_VALUES = [None, "x", "", [1], {"a": 1}, 10**400, 10**30, -1, 2**63, float("nan"), float("inf"), -float("inf"),
              "\x00", "\ud800", True]
BAD_NAMES = ["", "a\x00b", "\ud800", "x" * 200, "celery", "ingress", "unacked", "_kombu.binding.x", "celeryev.x",
             "a.pidbox", "a:b", "a b", 5, None, ["x"]]
REQUIRED = {"task_types": ("lane", "retry_policy"), "schedules": ("task_type",)}
FIELDS = {
    "retry_policies": ("max_retries", "initial_backoff", "multiplier", "max_backoff", "jitter"),
    "lanes": ("capacity", "accepting", "description"),
    "task_types": ("handler", "priority", "timeout", "attempt_timeout", "chat_scoped", "chat_queue_size",
                   "max_payload_bytes", "idempotency_window", "enabled", "options", "dedupe", "dedupe_window"),
    "schedules": ("payload", "chat_id", "limit_key", "priority", "missed", "enabled"),
}

#: Mutations that always make a document invalid, and ones that may or may not (a wrong-typed value
#: Django converts, e.g. ``True`` for a capacity, is fine either way as long as it is stored or named).
ALWAYS_BAD = {"bad_name", "unknown_key", "missing_ref", "missing_required", "duplicate", "bad_text", "not_object",
              "bad_dedupe"}


@st.composite
def mutated(draw) -> tuple[dict, str | None, str, str]:
    """(document, expected start of the error or None, the mutation's kind, a word the error must hold)."""
    doc = draw(documents())
    sections = [s for s in ("retry_policies", "lanes", "task_types", "schedules") if doc.get(s)]
    if not sections or draw(st.integers(0, 4)) == 0:
        return doc, None, "none", ""
    section = draw(st.sampled_from(sections))
    index = draw(st.integers(0, len(doc[section]) - 1))
    entry = doc[section][index]
    kinds = ["bad_value", "bad_name", "unknown_key", "duplicate", "bad_text", "not_object"]
    if section == "task_types":
        kinds += ["missing_ref", "missing_required", "bad_handler", "bad_dedupe"]
    if section == "schedules":
        kinds += ["missing_ref", "missing_required"]
    if section == "lanes":
        kinds += ["reserved_lane"]
    kind = draw(st.sampled_from(kinds))
    where = f"{section}[{index}]"
    mentions = ""
    if kind == "bad_value":
        field = draw(st.sampled_from(FIELDS[section]))
        entry[field] = draw(st.sampled_from(BAD_VALUES))
        # Not ": {field}" exactly: a value may be fine alone and clash with another field
        # (timeout 1 below attempt_timeout): the message names the entry and mentions the field.
        where = f"{where} {entry['name']!r}: "
        mentions = field
    elif kind == "bad_name":
        entry["name"] = draw(st.sampled_from(BAD_NAMES))
        if section != "lanes" and isinstance(entry["name"], str) and entry["name"] in BAD_NAMES[4:12]:
            entry["name"] += "\x00"  # reserved or odd for a lane, a fine policy or type name: make it bad
    elif kind == "reserved_lane":
        entry["name"] = draw(st.sampled_from(["celery", "ingress", "unacked", "unacked_index", "_kombu.binding.x",
                                              "celeryev.abc", "w1.pidbox", "celery-task-meta-1"]))
        where = f"{where} {entry['name']!r}: name"
    elif kind == "unknown_key":
        entry[draw(st.sampled_from(["surprise", "Name", "lane_name", "priority "]))] = 1
        where = f"{where} {entry['name']!r}: unknown field"
    elif kind == "duplicate":
        doc[section].append(dict(entry))
        where = f"{section}[{len(doc[section]) - 1}] {entry['name']!r}: name: duplicate of {section}[{index}]"
    elif kind == "bad_text":
        field = {"lanes": "description", "task_types": "options", "schedules": "payload"}.get(section, "name")
        bad = draw(st.sampled_from(["\x00", "\udfff"]))
        entry[field] = {"k": [f"a{bad}"]} if field in ("options", "payload") else f"x{bad}"
        where = f"{where} {entry['name']!r}: {field}"
    elif kind == "not_object":
        doc[section][index] = draw(st.sampled_from([[entry], "entry", 3, None, {"no_name": 1}]))
    elif kind == "missing_ref":
        field = draw(st.sampled_from(REQUIRED[section]))
        entry[field] = draw(st.sampled_from(["no-such-ref", "missing.one", "x" * 70, 5]))
        where = f"{where} {entry['name']!r}: {field}"
    elif kind == "missing_required":
        field = draw(st.sampled_from(REQUIRED[section]))
        del entry[field]
        where = f"{where} {entry['name']!r}: {field}"
    elif kind == "bad_dedupe":
        # A mode outside the three, a throttle or debounce without a window, a debounce past its timeout.
        bad = draw(st.sampled_from([("mode", "sometimes"), ("mode", "Throttle"), ("throttle", 0), ("debounce", 0),
                                    ("debounce", "timeout"), ("key", -1), ("throttle", 86401)]))
        entry["dedupe"] = bad[1] if bad[0] == "mode" else bad[0]
        if bad[0] != "mode":
            entry["dedupe_window"] = entry["timeout"] if bad[1] == "timeout" else bad[1]
        where = f"{where} {entry['name']!r}: {'dedupe' if bad[0] == 'mode' else 'dedupe_window'}"
    elif kind == "bad_handler":
        entry["handler"] = draw(st.sampled_from(["os.system", "", "demo.echo ", "http.post"]))
        where = f"{where} {entry['name']!r}: "
    return doc, where, kind, mentions


def snapshot() -> dict[str, list[dict]]:
    """What the config tables hold (every row, every column, in key order), and the DB's config revision.

    Read table by table (one query each): ``export_config`` reads each type's limits in a query of
    its own, and a whole suite's database holds hundreds of types (this test took 14.6 s there, 2.8 s
    alone). Every row's every column, ids and foreign keys included: what an export shows and more.
    """
    from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask

    from lanes.models import ConfigRevision, Lane
    from tasks.models import Limit, RetryPolicy, Schedule, TaskType, TaskTypeLimit

    models = (RetryPolicy, Lane, Limit, TaskType, TaskTypeLimit, Schedule, IntervalSchedule, CrontabSchedule,
              ClockedSchedule, PeriodicTask, ConfigRevision)
    return {model._meta.label: list(model.objects.order_by("pk").values()) for model in models}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@bounded(CONFIG_EXAMPLES)
@given(case=mutated())
@example(case=({"retry_policies": [{"name": "hp-huge", "initial_backoff": 10**400}]},
               "retry_policies[0] 'hp-huge': initial_backoff", "bad_value", ""))  # found: OverflowError escaped
@example(case=({"retry_policies": [{"name": "hp-list", "jitter": [1]}]},
               "retry_policies[0] 'hp-list': jitter", "bad_value", ""))  # found: TypeError from the model's clean()
@example(case=({"retry_policies": [{"name": "hp\udfff"}]}, "retry_policies[0]", "bad_name", ""))  # found: crashed
@example(case=({"retry_policies": [{"name": "hp\x00nul"}]}, "retry_policies[0]", "bad_name", ""))  # found: stored
@example(case=({"lanes": [{"name": "hp-desc", "description": "a\x00"}]},
               "lanes[0] 'hp-desc': description", "bad_text", ""))  # found: stored on SQLite, refused by PostgreSQL
@example(case=({"lanes": [{"name": "hp-dup"}, {"name": "hp-dup", "capacity": 3}]},
               "lanes[1] 'hp-dup': name: duplicate of lanes[0]", "duplicate", ""))  # found: the last one won silently
@example(case=({"retry_policies": [{"name": "hp-ddp"}], "lanes": [{"name": "hp-ddl"}],
                "task_types": [{"name": "hp.dd", "lane": "hp-ddl", "retry_policy": "hp-ddp", "handler": "demo.echo",
                                "timeout": 30, "attempt_timeout": 10, "dedupe": "debounce", "dedupe_window": 60}]},
               "task_types[0] 'hp.dd': dedupe_window", "bad_dedupe", "timeout"))
@example(case=({"retry_policies": [{"name": "hp-ddp"}], "lanes": [{"name": "hp-ddl"}],
                "task_types": [{"name": "hp.dd", "lane": "hp-ddl", "retry_policy": "hp-ddp", "handler": "demo.echo",
                                "dedupe": "sometimes"}]},
               "task_types[0] 'hp.dd': dedupe", "bad_dedupe", "throttle"))
def test_apply_config_is_all_or_nothing_and_names_the_bad_entry(case):
    from tasks.config_io import apply_config, export_config
    from tasks.errors import ConfigError

    doc, where, kind, mentions = case
    event(f"mutation={kind}")
    before = snapshot()
    try:
        counts = apply_config(doc)
    except ConfigError as exc:
        assert snapshot() == before, "a failed apply_config changed the database"
        assert where is not None, f"a valid document was refused: {exc}"
        assert str(exc).startswith(where), f"expected the error to name {where!r}, got {exc}"
        assert mentions in str(exc), f"expected the error to mention {mentions!r}, got {exc}"
        return
    assert kind not in ALWAYS_BAD, f"{kind} mutation was accepted: {doc}"
    assert counts == {section: len(doc[section]) for section in doc}
    exported = export_config()
    ours = {section: [e for e in exported[section] if e["name"] in {d["name"] for d in doc[section]}]
            for section in doc}  # the export may hold other sections (limits other tests defined)
    for section, entries in doc.items():
        stored = {e["name"]: e for e in ours[section]}
        assert len(stored) == len(entries)
        if where is None:  # unmutated: every field comes back as written
            for entry in entries:
                assert all(_same(stored[entry["name"]][k], v) for k, v in entry.items()), (entry, stored)
    # Applying the export again changes nothing (round trip).
    apply_config(ours)
    again = export_config()
    names = {section: [e["name"] for e in entries] for section, entries in ours.items()}
    assert {s: [e for e in again[s] if e["name"] in names[s]] for s in ours} == ours
