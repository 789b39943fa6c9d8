"""The handler registry: ``@handler("name")`` declares a handler; ``bind`` makes each a Celery task.

A handler is ``func(payload: dict, ctx: Context) -> JSON-able``; raise
``RetryableError`` (optionally with ``retry_after_s``) to be retried by the type's
policy, or ``NonRetryableError`` to give up. The admin offers exactly the
registered names when an operator picks a task type's handler.

Declaring a handler registers nothing with Celery (procrastinate's blueprint
pattern): ``TasksConfig.ready()`` binds every declared handler to the Celery app
as a task of that name on ``HandlerTask`` (so Flower shows it by name); a handler
declared after that (a module a worker imports with ``-I``) is bound at once.
The decorator returns the plain function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery import Celery, Task

from tasks.context import BatchItem, Context

__all__ = ["BatchItem", "Context", "HandlerSpec", "bind", "get", "handler", "handler_choices", "handler_names", "task",
           "validate_options"]

OptionsValidator = Callable[[dict], None]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    func: Callable[..., Any]
    validate_options: OptionsValidator | None
    description: str
    #: The option keys the handler reads; any other key is refused (a typo
    #: such as ``urll`` would otherwise be ignored). ``None``: not declared, not checked.
    option_keys: tuple[str, ...] | None = None
    #: Options of the Celery task bound for it (``@handler("x", queue=...)``).
    task_options: dict[str, Any] = field(default_factory=dict)
    #: Batched (``@handler("x", batch=True)``): called with a list of (payload, ctx)
    #: items, returns one outcome per item (tasks.batching).
    batch: bool = False


_handlers: dict[str, HandlerSpec] = {}
_tasks: dict[str, Task] = {}
#: The app and base task classes (plain, batched) handlers are bound to, once ``bind`` ran.
_bound_to: tuple[Celery, type[Task], type[Task] | None] | None = None


def handler(
    name: str,
    *,
    validate_options: OptionsValidator | None = None,
    option_keys: tuple[str, ...] | None = None,
    batch: bool = False,
    **task_options: Any,
) -> Callable[[F], F]:
    """Declare ``func`` as the handler ``name`` (also its Celery task name, shown in Flower).

    ``option_keys`` lists the task-type options the handler reads; others are refused.
    ``batch=True``: ``func(items)`` takes a list of ``(payload, ctx)`` and returns one
    outcome per item, in order: a value, or the exception that item raised
    (``RetryableError`` / ``NonRetryableError``); see docs/batching.md.
    """

    def decorator(func: F) -> F:
        if name in _handlers and _handlers[name].func is not func:
            raise ValueError(f"handler '{name}' is already registered")
        doc = (func.__doc__ or "").strip().splitlines()
        spec = HandlerSpec(name, func, validate_options, doc[0] if doc else "",
                           tuple(option_keys) if option_keys is not None else None, dict(task_options),
                           bool(batch))
        _handlers[name] = spec
        if _bound_to is not None:
            _bind_one(spec, *_bound_to)
        return func

    return decorator


def bind(app: Celery, base: type[Task], batch_base: type[Task] | None = None) -> None:
    """Make every declared handler (and each declared later) a task of ``app`` on ``base``
    (a batched one on ``batch_base``)."""
    global _bound_to
    _bound_to = (app, base, batch_base)
    for spec in list(_handlers.values()):
        _bind_one(spec, app, base, batch_base)


def _bind_one(spec: HandlerSpec, app: Celery, base: type[Task], batch_base: type[Task] | None = None) -> None:
    if spec.name in _tasks:
        return
    if spec.batch:
        if batch_base is None:
            raise ValueError(f"handler '{spec.name}' is batched, and no batched base task was given to bind")
        base = batch_base
    _tasks[spec.name] = app.task(
        name=spec.name, base=base, handler_func=staticmethod(spec.func), typing=False, batched=spec.batch,
        **spec.task_options
    )(spec.func)


def task(name: str) -> Task:
    """The Celery task bound for handler ``name`` (KeyError before ``bind`` or for an unknown name)."""
    return _tasks[name]


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
