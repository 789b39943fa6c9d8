"""Dispatching the lines of a JSON Lines file (``manage.py dispatch TYPE --payloads-file FILE.jsonl``).

Each non-blank line is one item: a payload (a JSON object), or the wrapper
``{"payload": {...}, "options": {...}}`` (an object whose keys are exactly
``payload`` and ``options``, or ``payload`` alone) whose options are
``dispatch.delay``'s (``chat_id``, ``priority``, ``idempotency_key``,
``timeout``, ``metadata``, ``limit_key``). The file is read and dispatched a
chunk at a time (``tasks.bulk.CHUNK_ITEMS`` lines, one Redis round trip), so
its size is bounded by nothing but time. A line that is not JSON is rejected
alone, its number in the detail; blank lines are skipped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tasks import bulk
from tasks.admission import DispatchResult

#: Rejections listed (with their line numbers) in a summary; the rest are only counted.
MAX_LISTED = 20
WRAPPER_KEYS = ({"payload"}, {"payload", "options"})


@dataclass
class Summary:
    """What happened to a file's lines: counts, and the first rejections with their line numbers."""

    lines: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: Counter = field(default_factory=Counter)
    #: Lines answered ``unavailable``: Redis did not answer; retry them with the same idempotency keys.
    unavailable: int = 0
    listed: list[dict[str, Any]] = field(default_factory=list)

    def add(self, line: int, result: DispatchResult) -> None:
        self.lines += 1
        if result.accepted:
            self.accepted += 1
            self.duplicates += result.duplicate
            return
        if result.reason == "unavailable":
            self.unavailable += 1
        else:
            self.rejected[result.reason] += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append({"line": line, "reason": result.reason, "detail": result.detail})

    def progress(self) -> str:
        return (f"{self.lines} lines: {self.accepted} accepted, {sum(self.rejected.values())} rejected, "
                f"{self.unavailable} unavailable")

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "accepted": self.accepted, "duplicates": self.duplicates,
                "rejected": dict(sorted(self.rejected.items())), "unavailable": self.unavailable,
                "rejections": self.listed,
                **({"rejections_not_listed": self.lines - self.accepted - len(self.listed)}
                   if self.lines - self.accepted > len(self.listed) else {})}


def parse_line(text: str, number: int) -> tuple[Any, dict[str, Any]] | DispatchResult:
    """One line as ``(payload, options)``, or the rejection of a line that is not JSON."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = f"line {number} is not valid JSON: {exc}"[:500]
        return DispatchResult(False, reason="invalid_payload", detail=detail)
    if isinstance(value, dict) and set(value) in WRAPPER_KEYS:
        return value["payload"], value.get("options") or {}
    return value, {}


def dispatch_lines(task_type: str, lines: Iterable[str], *, defaults: dict[str, Any] | None = None,
                   on_result: Callable[[int, DispatchResult], None] | None = None,
                   on_chunk: Callable[[Summary], None] | None = None, id_prefix: str = "") -> Summary:
    """Dispatch each non-blank line as an item of ``task_type``; ``defaults`` are options every item gets
    unless its own say otherwise (``timeout``, ``metadata``, ``priority``, ``chat_id``); ``id_prefix``
    starts every task id (``tasks.owners``)."""
    summary = Summary()
    defaults = {k: v for k, v in (defaults or {}).items() if v is not None}
    for chunk in _chunks(lines, bulk.CHUNK_ITEMS):
        answers: dict[int, DispatchResult] = {}
        items: list[tuple[Any, Any]] = []
        numbers: list[int] = []
        for number, text in chunk:
            parsed = parse_line(text, number)
            if isinstance(parsed, DispatchResult):
                answers[number] = parsed
                continue
            payload, options = parsed
            if isinstance(options, dict):
                options = {**defaults, **options}
            items.append((payload, options))
            numbers.append(number)
        answers.update(zip(numbers, bulk.dispatch_many(task_type, items, id_prefix=id_prefix),
                           strict=True))
        for number in sorted(answers):
            summary.add(number, answers[number])
            if on_result:
                on_result(number, answers[number])
        if on_chunk:
            on_chunk(summary)
    return summary


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[tuple[int, str]]]:
    chunk: list[tuple[int, str]] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        chunk.append((number, text))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
