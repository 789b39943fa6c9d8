"""What handlers raise to steer retries, and what the platform raises itself."""

from __future__ import annotations


class DispatchError(Exception):
    """Root of the platform's exceptions."""


class RetryableError(DispatchError):
    """The attempt failed but may succeed later; ``retry_after_s`` asks for a least delay."""

    def __init__(self, message: str = "retryable failure", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NonRetryableError(DispatchError):
    """The attempt failed for good: the task becomes a dead letter without more attempts."""


class TaskCancelled(DispatchError):
    """A handler stops because its task was cancelled (``ctx.cancelled``): it ends cancelled, never retried."""


class AttemptTimeout(RetryableError):
    """The attempt ran past its time limit (min of attempt_timeout and time left)."""


class DeadLettered(DispatchError):
    """Raised to Celery after a task became a dead letter, so Flower shows it as failed."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason

    @classmethod
    def because(cls, reason: str, detail: str = "", *, task_type: str = "", admin_url: str = "") -> DeadLettered:
        """The failure Celery stores and Flower shows: type, reason, detail and where to act on it."""
        text = f"dead letter ({reason})" + (f" of {task_type}" if task_type else "") + (f": {detail}" if detail else "")
        return cls(f"{text} - see {admin_url}" if admin_url else text, reason)


class ConfigError(DispatchError):
    """A configuration file or entry is invalid; the message names the bad entry."""
