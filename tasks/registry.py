"""The handler registry: ``@handler("name")`` makes a function a Celery task on ``HandlerTask``.

A handler is ``func(payload: dict, ctx: Context) -> JSON-able``; raise
``RetryableError`` (optionally with ``retry_after_s``) to be retried by the type's
policy, or ``NonRetryableError`` to give up. The admin offers exactly the
registered names when an operator picks a task type's handler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dispatchsite.celery import app

OptionsValidator = Callable[[dict], None]


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    func: Callable[..., Any]
    validate_options: OptionsValidator | None
    description: str


_handlers: dict[str, HandlerSpec] = {}


def handler(name: str, *, validate_options: OptionsValidator | None = None, **task_options: Any):
    """Register ``func`` as the handler ``name`` (also its Celery task name, shown in Flower)."""
    from tasks.execution import HandlerTask

    def decorator(func: Callable[..., Any]) -> Any:
        if name in _handlers and _handlers[name].func is not func:
            raise ValueError(f"handler '{name}' is already registered")
        task = app.task(
            name=name, base=HandlerTask, handler_func=staticmethod(func), typing=False, **task_options
        )(func)
        doc = (func.__doc__ or "").strip().splitlines()
        _handlers[name] = HandlerSpec(name, func, validate_options, doc[0] if doc else "")
        return task

    return decorator


def handler_names() -> list[str]:
    return sorted(_handlers)


def handler_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in handler_names()]


def get(name: str) -> HandlerSpec:
    return _handlers[name]


def validate_options(name: str, options: dict) -> None:
    """Raise ValueError naming what is wrong with a task type's ``options``."""
    spec = _handlers[name]
    if spec.validate_options is not None:
        spec.validate_options(options)
