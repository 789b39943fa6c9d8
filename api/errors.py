"""The API's one error shape: ``{"reason": ..., "detail": ...}`` as JSON, never HTML."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A refusal before admission (auth, scope, rate, size), with its HTTP status."""

    def __init__(self, status: int, reason: str, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.headers = headers or {}


def body(reason: str, detail: Any) -> dict[str, Any]:
    return {"reason": reason, "detail": detail}
