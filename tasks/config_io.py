"""Config as code: ``apply_config`` / ``export_config`` in the DESIGN.md JSON format.

A file is checked entry by entry with the same model validation as the admin;
the first bad entry stops everything and is named (``task_types[2] 'chat.send':
lane: ...``); nothing is written unless every entry is valid.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from lanes.models import Lane
from tasks.errors import ConfigError
from tasks.models import Limit, RetryPolicy, TaskType
from tasks.schedule_config import apply_schedules, export_schedules
from tasks.validation import shown, unstorable_text

SECTIONS = ("retry_policies", "lanes", "limits", "task_types", "schedules")
POLICY_FIELDS = ("max_retries", "initial_backoff", "multiplier", "max_backoff", "jitter")
LANE_FIELDS = ("capacity", "accepting", "description")
LIMIT_FIELDS = ("scope", "rate", "burst", "max_in_flight", "fair_share", "weights", "window")
TYPE_FIELDS = ("handler", "priority", "timeout", "attempt_timeout", "chat_scoped", "chat_queue_size",
               "max_payload_bytes", "idempotency_window", "enabled", "options", "batch_size", "batch_window_ms",
               "shared", "max_delay", "store_result", "dedupe", "dedupe_window")


def _entries(data: dict, section: str) -> list[dict]:
    entries = data.get(section, [])
    if not isinstance(entries, list):
        raise ConfigError(f"{section}: must be a list")
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ConfigError(f"{section}[{i}]: must be an object with a non-empty string 'name'")
        where = f"{section}[{i}] {entry['name']!r}"
        if entry["name"] in seen:
            # Upserting twice in one file would keep the last silently: say which two collide.
            raise ConfigError(f"{where}: name: duplicate of {section}[{seen[entry['name']]}]")
        seen[entry["name"]] = i
        for field, value in entry.items():
            # Text no database stores (NUL: PostgreSQL; lone surrogates: any UTF-8) is refused
            # here, named, instead of failing the insert with a driver error.
            bad = unstorable_text(value, str(field))
            if bad:
                raise ConfigError(f"{where}: {bad}")
    return entries


def _check_keys(where: str, entry: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(entry) - {"name", *allowed})
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: name, {', '.join(allowed)}")


def _save(where: str, obj: Any) -> None:
    try:
        obj.full_clean()
    except ValidationError as exc:
        problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
        raise ConfigError(f"{where}: {problems}") from None
    obj.save()


def _fetch_and_set(where: str, model: type[Any], entry: dict, fields: tuple[str, ...]) -> Any:
    """The row named ``entry['name']`` (or a new one) with the entry's fields set on it.

    Each value is converted by its model field first, so a wrong type is named here
    (``capacity: ...``) rather than raising TypeError or OverflowError (``float(10**400)``)
    from inside the model's checks.
    """
    obj = model.objects.filter(name=entry["name"]).first() or model(name=entry["name"])
    for field in fields:
        if field in entry:
            model_field = model._meta.get_field(field)
            if entry[field] is None and not model_field.null:
                raise ConfigError(f"{where}: {field}: null is not allowed (leave the field out for its default)")
            try:
                value = model_field.to_python(entry[field])
            except ValidationError as exc:
                raise ConfigError(f"{where}: {field}: {' '.join(exc.messages)}") from None
            except (TypeError, ValueError, OverflowError) as exc:
                raise ConfigError(f"{where}: {field}: {shown(entry[field])} is not a valid value ({exc})") from None
            setattr(obj, field, value)
    return obj


def _upsert_plain(data: dict, section: str, model: type, fields: tuple[str, ...]) -> int:
    """Upsert a section whose entries have no references to other sections."""
    entries = _entries(data, section)
    for i, entry in enumerate(entries):
        where = f"{section}[{i}] {entry['name']!r}"
        _check_keys(where, entry, fields)
        _save(where, _fetch_and_set(where, model, entry, fields))
    return len(entries)


def apply_config(data: Any) -> dict[str, int]:
    """Upsert every entry of ``data`` in one transaction; returns counts per section."""
    if not isinstance(data, dict):
        raise ConfigError("the config must be a JSON object with retry_policies, lanes, limits, task_types, schedules")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(unknown)}; expected: {', '.join(SECTIONS)}")
    counts = {}
    with transaction.atomic():
        counts["retry_policies"] = _upsert_plain(data, "retry_policies", RetryPolicy, POLICY_FIELDS)
        counts["lanes"] = _upsert_plain(data, "lanes", Lane, LANE_FIELDS)
        if "limits" in data:  # counted only when the file has the section (older files print as before)
            counts["limits"] = _upsert_plain(data, "limits", Limit, LIMIT_FIELDS)
        for i, entry in enumerate(_entries(data, "task_types")):
            where = f"task_types[{i}] {entry['name']!r}"
            _check_keys(where, entry, (*TYPE_FIELDS, "lane", "retry_policy", "limits"))
            obj = _fetch_and_set(where, TaskType, entry, TYPE_FIELDS)
            for field, model in (("lane", Lane), ("retry_policy", RetryPolicy)):
                if field in entry:
                    ref = model.objects.filter(name=entry[field]).first()
                    if ref is None:
                        raise ConfigError(f"{where}: {field} {entry[field]!r} does not exist")
                    setattr(obj, field, ref)
                elif obj.pk is None:
                    raise ConfigError(f"{where}: {field} is required for a new task type")
            _save(where, obj)
            if "limits" in entry:
                _set_type_limits(where, obj, entry["limits"])
        counts["task_types"] = len(data.get("task_types", []))
        if "schedules" in data:  # after the types they fire (tasks.schedule_config)
            counts["schedules"] = apply_schedules(_entries(data, "schedules"), _check_keys)
    return counts


def _set_type_limits(where: str, task_type: TaskType, names: Any) -> None:
    """Make ``names`` (existing limits, in order) the type's limits."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: limits: must be a list of limit names")
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: limits: a limit is named twice")
    found = {limit.name: limit for limit in Limit.objects.filter(name__in=names)}
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigError(f"{where}: limits: {', '.join(repr(n) for n in missing)} does not exist")
    task_type.set_limits([found[n] for n in names])


def export_config() -> dict[str, list[dict]]:
    return {
        "retry_policies": [
            {"name": p.name, **{f: getattr(p, f) for f in POLICY_FIELDS}} for p in RetryPolicy.objects.all()
        ],
        "lanes": [{"name": lane.name, **{f: getattr(lane, f) for f in LANE_FIELDS}} for lane in Lane.objects.all()],
        "limits": [{"name": limit.name, **{f: getattr(limit, f) for f in LIMIT_FIELDS}}
                   for limit in Limit.objects.all()],
        "task_types": [
            {"name": t.name, "lane": t.lane.name, "retry_policy": t.retry_policy.name,
             **{f: getattr(t, f) for f in TYPE_FIELDS}, "limits": t.limit_names()}
            for t in TaskType.objects.select_related("lane", "retry_policy")
        ],
        "schedules": export_schedules(),
    }


#: Handlers the default config sets up for tests and load tests only (the tools app's):
#: a production install (``DISPATCH_PROFILE=production``) gets no task type for them,
#: nor does one where they are not registered (``DISPATCH_TOOLS=0``).
NON_PRODUCTION_HANDLERS = frozenset({"loadtest.sink", "loadtest.sink_batch"})


#: The web site's address in the default configuration (the demo receiver ``chat.send`` posts to).
DEFAULT_WEB_ORIGIN = "http://127.0.0.1:8000/"


def with_web_port(data: dict, web_port: int) -> dict:
    """``data`` with the default config's URLs on this site pointing at ``web_port`` (``WEB_PORT``)."""
    origin = f"http://127.0.0.1:{web_port}/"
    types = []
    for entry in data.get("task_types", []):
        url = (entry.get("options") or {}).get("url")
        if isinstance(url, str) and url.startswith(DEFAULT_WEB_ORIGIN):
            entry = {**entry, "options": {**entry["options"], "url": origin + url[len(DEFAULT_WEB_ORIGIN):]}}
        types.append(entry)
    return {**data, "task_types": types}


def default_config_for(data: dict, profile: str, handlers: Collection[str] | None = None) -> dict:
    """The default config ``data`` as ``manage.py bootstrap`` applies it under ``profile``.

    ``handlers``: the registered handler names, if known; a non-production
    handler missing from them (the tools app left out) gets no task type. The
    production profile has no ``demo.*`` types either.
    """
    def keep(entry: dict) -> bool:
        name = entry.get("handler")
        if profile == "production" and (str(name).startswith("demo.") or str(entry.get("name")).startswith("demo.")):
            return False  # demo.echo sleeps up to an hour on request: a demo, not a production type
        if name not in NON_PRODUCTION_HANDLERS:
            return True
        return profile != "production" and (handlers is None or name in handlers)

    types = [t for t in data.get("task_types", []) if keep(t)]
    if len(types) == len(data.get("task_types", [])):
        return data
    return {**data, "task_types": types}

