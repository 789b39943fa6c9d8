"""The kombu message a worker delivers for a task (``lanes.messages.kombu_message`` of what
``build_message`` stored), as a plain dict built field by field: the reference
``tests/unit/test_messages.py`` holds it to (only tests use it)."""

from __future__ import annotations

import json
from typing import Any

from lanes import keys
from lanes.messages import _EMBED, LEASED_HEADER, RECORD_HEADER, Envelope, _short_repr, hard_limit_grace_s
from lanes.priorities import to_kombu


def message_dict(task_id: str, handler: str, payload_json: str, envelope: Envelope, soft_limit_s: float,
                 delivery_tag: str = "tag") -> dict[str, Any]:
    """The message as a dict, its body the JSON text Celery reads."""
    body = f'[[],{{"payload":{payload_json},"dispatch":{json.dumps(envelope.as_dict(), separators=(",", ":"))}}},' \
        f'{json.dumps(_EMBED, separators=(",", ":"))}]'
    # Celery's empty or default headers (eta, expires, group, group_index, parent_id, ignore_result,
    # replaced_task_nesting, stamped_headers, stamps) are left out: its Request reads each with .get.
    headers: dict[str, Any] = {
        "lang": "py", "task": handler, "id": task_id, "shadow": envelope.type, "retries": envelope.attempt - 1,
        "timelimit": [soft_limit_s + hard_limit_grace_s(), soft_limit_s], "root_id": task_id,
        "argsrepr": "()", "kwargsrepr": _short_repr(payload_json, envelope.attempt, envelope.chat),
        LEASED_HEADER: True, RECORD_HEADER: keys.task_record(task_id, envelope.chat or None),
    }
    return {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "delivery_info": {"exchange": "", "routing_key": keys.lane_queue(envelope.lane, 0)},
            "priority": to_kombu(envelope.priority),
            "body_encoding": "utf-8",
            "delivery_tag": delivery_tag,
        },
    }
