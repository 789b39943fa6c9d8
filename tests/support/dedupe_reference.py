"""A pure model of the three dedupe modes (``tasks.dedupe``), which admit.lua's decisions are held to.

No worker runs beside it: a debounced task never starts, so each one waits
until a later dispatch of its key replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    """``kind``: 'new' (admitted; ``replaced`` the task it replaced, '' none), 'dup' or 'conflict'
    (``task_id``: the earlier task's)."""

    kind: str
    task_id: str
    replaced: str = ""


@dataclass
class Reference:
    window_ms: int
    #: key mode: key -> (task id, payload); throttle: key -> (task id, until ms); debounce: key -> task id.
    idempotency: dict[str, tuple[str, object]] = field(default_factory=dict)
    throttled: dict[str, tuple[str, int]] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    replaced_by: dict[str, str] = field(default_factory=dict)

    def dispatch(self, mode: str, key: str, payload: object, now: float, task_id: str) -> Answer:
        """The answer to a dispatch at ``now`` (epoch seconds; admission counts whole milliseconds)."""
        now_ms = int(now * 1000)
        if mode == "key":
            earlier = self.idempotency.get(key)
            if earlier is None:
                self.idempotency[key] = (task_id, payload)
                return Answer("new", task_id)
            return Answer("dup" if earlier[1] == payload else "conflict", earlier[0])
        if mode == "throttle":
            held = self.throttled.get(key)
            if held is not None and now_ms < held[1]:
                return Answer("dup", held[0])
            self.throttled[key] = (task_id, now_ms + self.window_ms)
            return Answer("new", task_id)
        earlier_id = self.waiting.get(key, "")
        self.waiting[key] = task_id
        if earlier_id:
            self.replaced_by[earlier_id] = task_id
        return Answer("new", task_id, earlier_id)
