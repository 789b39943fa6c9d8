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
    #: The option keys the handler reads; any other key is refused (a typo
    #: such as ``urll`` would otherwise be ignored). ``None``: not declared, not checked.
    option_keys: tuple[str, ...] | None = None


_handlers: dict[str, HandlerSpec] = {}


def handler(
    name: str,
    *,
    validate_options: OptionsValidator | None = None,
    option_keys: tuple[str, ...] | None = None,
    **task_options: Any,
):
    """Register ``func`` as the handler ``name`` (also its Celery task name, shown in Flower).

    ``option_keys`` lists the task-type options the handler reads; others are refused.
    """
    from tasks.execution import HandlerTask

    def decorator(func: Callable[..., Any]) -> Any:
        if name in _handlers and _handlers[name].func is not func:
            raise ValueError(f"handler '{name}' is already registered")
        task = app.task(
            name=name, base=HandlerTask, handler_func=staticmethod(func), typing=False, **task_options
        )(func)
        doc = (func.__doc__ or "").strip().splitlines()
        _handlers[name] = HandlerSpec(name, func, validate_options, doc[0] if doc else "",
                                      tuple(option_keys) if option_keys is not None else None)
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
    if spec.option_keys is not None:
        unknown = sorted(set(options) - set(spec.option_keys))
        if unknown:
            known = ", ".join(spec.option_keys) or "none"
            raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(repr(k) for k in unknown)} for handler '{name}'; known options: {known}")
    if spec.validate_options is not None:
        spec.validate_options(options)
