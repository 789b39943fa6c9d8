"""Checks of one dispatch call against its task type: pure, returns a reason or None."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanes import jsontext
from tasks.retry import MAX_TIMEOUT_S

MAX_CHAT_ID_LEN = 128
MAX_IDEMPOTENCY_KEY_LEN = 200
MAX_METADATA_BYTES = 4096
MAX_LIMIT_KEY_LEN = 128


@dataclass(slots=True)
class Checked:
    """A dispatch that passed validation, with its payload already encoded (not frozen: see ``Prepared``)."""

    payload_json: str
    priority: int
    timeout_s: float
    chat_id: str
    idempotency_key: str
    metadata: dict


#: A rejection's detail is logged and shown on every rejection: it never grows with the input.
MAX_DETAIL_LEN = 500


class Invalid(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        if len(detail) > MAX_DETAIL_LEN:
            detail = detail[: MAX_DETAIL_LEN - 3] + "..."
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a rejection's detail; never raises.

    The value is the caller's, so anything goes: ``repr`` of an int over 4300 digits
    raises ValueError, a 1 MB string would make a 1 MB detail.
    """
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # repr of a huge string is not built only to be cut
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a caller's object may raise anything from __repr__
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_clean_text(value: Any, max_len: int) -> bool:
    """A non-empty str of printable characters (no NUL, controls or lone surrogates)."""
    return isinstance(value, str) and 0 < len(value) <= max_len and value.isprintable()


def unstorable_text(value: Any, root: str) -> str | None:
    """Where a JSON value holds text no database can store, as ``root.a[3].b contains U+0000``, or None.

    PostgreSQL's ``jsonb`` (the dead-letter row) refuses NUL, and lone
    surrogates cannot be written as UTF-8 at all: a task carrying either would
    be accepted, then fail to be recorded when it dies. Walks keys and values
    at any depth without recursion (the value is known to be acyclic: it was
    JSON-encoded first).
    """
    stack: list[tuple[str, Any]] = [(root, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            bad = _bad_char(item)
            if bad:
                return f"{_short_path(path)} contains {bad}"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                name = key if isinstance(key, str) else str(key)
                bad = _bad_char(name)
                if bad:
                    return f"{_short_path(path)} has a key {shown(name, 40)} containing {bad}"
                step = f".{name}" if name.isidentifier() and len(name) <= 40 else f"[{shown(name, 40)}]"
                stack.append((path + step, child))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def _short_path(path: str, limit: int = 200) -> str:
    """A path deep in a value, its middle elided so the detail stays readable."""
    return path if len(path) <= limit else f"{path[:60]}...{path[-(limit - 63):]}"


def _bad_char(text: str) -> str | None:
    if "\x00" in text:
        return "U+0000"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate U+{ord(text[exc.start]):04X}"
    return None


def scrub_text(text: str) -> str:
    """``text`` with NUL and lone surrogates escaped, so any database column stores it."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _encode_checked(value: Any, reason: str, root: str) -> str:
    """``encode_json`` of ``value``, or ``Invalid(reason)`` naming where it is bad."""
    try:
        text = encode_json(value)
    except UnicodeEncodeError:
        text = None
    except (TypeError, ValueError, RecursionError) as exc:
        # RecursionError: nested too deep to encode (the fault campaign's hostile input made
        # dispatch raise instead of answering; a rejection is a result, never an exception).
        raise Invalid(reason, f"{root} is not valid JSON: {exc}") from None
    # NUL always shows as \u0000 in the JSON text: walk only when it (or a surrogate) may be there.
    if text is None or "\\u0000" in text:
        where = unstorable_text(value, root)
        if where:
            raise Invalid(reason, where)
        if text is None:
            raise Invalid(reason, f"{root} is not valid UTF-8")
    return text


#: Compact JSON that is valid UTF-8; raises ValueError, TypeError or RecursionError (a cycle) on anything
#: that is not JSON, UnicodeEncodeError on text that is not UTF-8 (orjson, held to ``json.dumps``).
encode_json = jsontext.dumps


def check_dispatch(
    *,
    type_name: str,
    enabled: bool,
    chat_scoped: bool,
    max_payload_bytes: int,
    default_priority: int,
    default_timeout_s: float,
    payload: Any,
    priority: Any,
    timeout: Any,
    chat_id: Any,
    idempotency_key: Any,
    metadata: Any,
) -> Checked:
    """Validate one dispatch; raise ``Invalid(reason, detail)`` naming what is wrong."""
    if not enabled:
        raise Invalid("type_disabled", f"task type '{type_name}' is disabled")
    if not isinstance(payload, dict):
        raise Invalid("invalid_payload", f"payload must be a JSON object, not {type(payload).__name__}")
    payload_json = _encode_checked(payload, "invalid_payload", "payload")
    size = len(payload_json) if payload_json.isascii() else len(payload_json.encode("utf-8"))
    if size > max_payload_bytes:
        raise Invalid("payload_too_large", f"payload is {size} bytes; '{type_name}' allows {max_payload_bytes}")

    if priority is None:
        priority = default_priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise Invalid("invalid_priority", f"priority must be an integer 0..9, not {shown(priority)}")

    if timeout is None:
        timeout = default_timeout_s
    # The range test alone refuses nan and inf, and compares ints of any size exactly
    # (math.isfinite(10**400) raised OverflowError out of dispatch).
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise Invalid("invalid_timeout",
                      f"timeout must be seconds in (0, {MAX_TIMEOUT_S:.0f}], not {shown(timeout)}")

    if chat_id is None:
        if chat_scoped:
            raise Invalid("invalid_chat_id", f"task type '{type_name}' is chat-scoped: a chat_id is required")
        chat_id = ""
    elif not is_clean_text(chat_id, MAX_CHAT_ID_LEN):
        raise Invalid("invalid_chat_id", f"chat_id must be 1..{MAX_CHAT_ID_LEN} printable characters")

    if idempotency_key is None:
        idempotency_key = ""
    elif not is_clean_text(idempotency_key, MAX_IDEMPOTENCY_KEY_LEN):
        raise Invalid(
            "invalid_idempotency_key", f"idempotency_key must be 1..{MAX_IDEMPOTENCY_KEY_LEN} printable characters"
        )

    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise Invalid("invalid_metadata", "metadata must be a JSON object")
    meta_size = len(_encode_checked(metadata, "invalid_metadata", "metadata").encode("utf-8")) if metadata else 2
    if meta_size > MAX_METADATA_BYTES:
        raise Invalid("invalid_metadata", f"metadata is {meta_size} bytes; at most {MAX_METADATA_BYTES}")

    return Checked(payload_json, priority, float(timeout), chat_id, idempotency_key, metadata)


def check_limits(*, type_name: str, limits: tuple[tuple[str, str], ...], limit_key: Any, chat_id: str) -> str:
    """Check a dispatch's ``limit_key`` against its type's limits ((name, scope) pairs, in order).

    Returns the key ('' when none). A type with a ``key`` limit needs one
    (``invalid_limit_key``); a type without one ignores it, so a caller keeps
    working when an operator removes a key limit. A ``chat`` limit needs a chat id.
    """
    if limit_key is not None and not is_clean_text(limit_key, MAX_LIMIT_KEY_LEN):
        raise Invalid("invalid_limit_key", f"limit_key must be 1..{MAX_LIMIT_KEY_LEN} printable characters")
    for name, scope in limits:
        if scope == "key" and limit_key is None:
            raise Invalid("invalid_limit_key", f"task type '{type_name}' has the per-key limit '{name}': "
                                               "a limit_key is required")
        if scope == "chat" and not chat_id:
            raise Invalid("invalid_chat_id", f"task type '{type_name}' has the per-chat limit '{name}': "
                                             "a chat_id is required")
    return limit_key or ""
