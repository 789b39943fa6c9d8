from __future__ import annotations

import json
import math
import re

from django.core.exceptions import ValidationError
from django.db import models

from tasks import dedupe as dedupe_rules
from tasks import registry
from tasks.retry import MAX_TIMEOUT_S

TYPE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
#: A limit's name is part of its Redis keys (``dispatch:lim:{name}:{value}``): no ':' in it.
LIMIT_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def validate_type_name(value: str) -> None:
    if not TYPE_NAME_RE.match(value or ""):
        raise ValidationError("Type name must be 1-100 letters, digits, '_', '.', ':' or '-'.")


def _valid_unicode(value: object) -> bool:
    """Whether ``value``'s strings are all encodable as UTF-8 (JSON's ``"\\ud800"`` decodes to one that is not)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class RetryPolicy(models.Model):
    """How failed attempts are retried: delay = min(max, initial * multiplier^n) +/- jitter."""

    name = models.CharField("name", max_length=64, unique=True)
    max_retries = models.PositiveIntegerField(
        "max retries", default=5, help_text="Retries after the first attempt."
    )
    initial_backoff = models.FloatField("initial backoff (s)", default=1.0)
    multiplier = models.FloatField("multiplier", default=2.0)
    max_backoff = models.FloatField("max backoff (s)", default=60.0)
    jitter = models.FloatField(
        "jitter", default=0.2, help_text="Fraction of the delay, 0..1, added or removed at random."
    )

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "retry policies"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = {}
        if self.max_retries is not None and self.max_retries > 100:
            errors["max_retries"] = "At most 100 retries."
        if self.initial_backoff is not None and not 0 <= self.initial_backoff <= 86400:
            errors["initial_backoff"] = "Initial backoff must be between 0 and 86400 seconds."
        if self.multiplier is not None and not 1 <= self.multiplier <= 100:
            errors["multiplier"] = "Multiplier must be between 1 and 100."
        if self.max_backoff is not None and not 0 <= self.max_backoff <= 86400:
            errors["max_backoff"] = "Max backoff must be between 0 and 86400 seconds."
        if (self.max_backoff is not None and self.initial_backoff is not None
                and self.max_backoff < self.initial_backoff):
            errors["max_backoff"] = "Max backoff must not be below the initial backoff."
        if self.jitter is not None and not 0 <= self.jitter <= 1:
            errors["jitter"] = "Jitter must be between 0 and 1."
        if errors:
            raise ValidationError(errors)


#: Names the limits' own keys use under ``dispatch:lim:`` (lanes.keys): no limit may take them.
RESERVED_LIMIT_NAMES = frozenset({"def", "due", "seq", "inst", "ring", "credit", "audit-cursor"})


def validate_limit_name(value: str) -> None:
    if not LIMIT_NAME_RE.match(value or ""):
        raise ValidationError("Limit name must be 1-64 letters, digits, '_', '.' or '-' (no ':').")
    if value in RESERVED_LIMIT_NAMES:
        raise ValidationError(f"'{value}' is reserved; choose another limit name.")


class Limit(models.Model):
    """Flow control shared by every worker: a token bucket, a cap on running tasks, or a fair share.

    Task types name the limits that apply to them; a task starts only when each
    of them admits it, and waits in Redis (no worker slot, no attempt) until then.
    """

    class Scope(models.TextChoices):
        GLOBAL = "global", "global (one for every task of the types naming it)"
        CHAT = "chat", "chat (one per chat id)"
        KEY = "key", "key (one per dispatch limit_key)"

    name = models.CharField("name", max_length=64, unique=True, validators=[validate_limit_name],
                            help_text="Named by task types; letters, digits, '_', '.', '-'.")
    scope = models.CharField("scope", max_length=8, choices=Scope.choices, default=Scope.GLOBAL,
                             help_text="What one bucket covers: everything, one chat, or one limit_key value.")
    rate = models.FloatField("rate (tasks/s)", null=True, blank=True,
                             help_text="Tasks started per second (token bucket); empty: no rate.")
    burst = models.PositiveIntegerField("burst", null=True, blank=True,
                                        help_text="Most tasks started at once after an idle spell (bucket size); "
                                                  "default: the rate rounded up.")
    max_in_flight = models.PositiveIntegerField("max in flight", null=True, blank=True,
                                                help_text="Most tasks running at once; empty: no cap.")
    fair_share = models.BooleanField("fair share", default=False,
                                     help_text="Admit tasks round-robin across keys (scope 'key' only), so one "
                                               "key's flood cannot starve another.")
    weights = models.JSONField("weights", default=dict, blank=True,
                               help_text="Fair share: key -> positive integer turns per round (default 1).")
    window = models.PositiveIntegerField("window", null=True, blank=True,
                                         help_text="Fair share: most tasks of this limit published at once over all "
                                                   "keys (default: max in flight, else 32).")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.rate is not None and not 0 < self.rate <= 1_000_000:
            errors["rate"] = "Rate must be above 0 and at most 1000000 tasks per second."
        if self.rate is None and self.burst is not None:
            errors["burst"] = "Burst applies to a rate: set a rate or leave burst empty."
        if self.rate is not None and self.burst is not None and not 1 <= self.burst <= 1_000_000:
            errors["burst"] = "Burst must be between 1 and 1000000."
        if self.max_in_flight is not None and not 1 <= self.max_in_flight <= 1_000_000:
            errors["max_in_flight"] = "Max in flight must be between 1 and 1000000."
        if self.window is not None and not 1 <= self.window <= 1_000_000:
            errors["window"] = "Window must be between 1 and 1000000."
        if self.fair_share and self.scope != self.Scope.KEY:
            errors["scope"] = "Fair share needs scope 'key' (it shares between keys)."
        if not self.fair_share and self.window is not None:
            errors["window"] = "Window applies to a fair share only."
        if self.rate is None and self.max_in_flight is None and not self.fair_share and not errors:
            errors["rate"] = "Set a rate, a max in flight, or fair share: this limit would limit nothing."
        if not isinstance(self.weights, dict):
            errors["weights"] = "Weights must be a JSON object of key -> positive integer."
        else:
            bad = [k for k, v in self.weights.items()
                   if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1000 or not k]
            if bad:
                errors["weights"] = f"Weights must be integers 1..1000 per non-empty key; not for {bad[:3]}."
            elif self.weights and not self.fair_share:
                errors["weights"] = "Weights apply to a fair share only."
            elif not _valid_unicode(self.weights):
                errors["weights"] = "Weights must be valid Unicode."
        if errors:
            raise ValidationError(errors)

    def as_def(self) -> dict:
        """What the Lua scripts read (``dispatch:lim:def``): the checked values, defaults applied."""
        burst = self.burst if self.burst is not None else (max(1, math.ceil(self.rate)) if self.rate else None)
        window = (self.window or self.max_in_flight or 32) if self.fair_share else None
        return {"scope": self.scope, "rate": self.rate, "burst": burst, "max_in_flight": self.max_in_flight,
                "fair_share": self.fair_share, "weights": dict(self.weights or {}), "window": window}


#: Most tasks one call of a batched handler takes.
MAX_BATCH_SIZE = 1000
#: Longest a worker waits to fill a batch, in milliseconds.
MAX_BATCH_WINDOW_MS = 1000


class TaskType(models.Model):
    """What callers dispatch by name: which handler runs it, in which lane, how it retries."""

    name = models.CharField("name", max_length=100, unique=True, validators=[validate_type_name])
    handler = models.CharField(
        "handler", max_length=100, choices=registry.handler_choices,
        help_text="A registered handler; the list comes from the code, never a typed import path.",
    )
    lane = models.ForeignKey("lanes.Lane", on_delete=models.PROTECT, related_name="task_types")
    priority = models.PositiveSmallIntegerField("default priority", default=5, help_text="0..9, higher runs first.")
    retry_policy = models.ForeignKey(RetryPolicy, on_delete=models.PROTECT, related_name="task_types")
    timeout = models.FloatField("timeout (s)", default=300, help_text="Whole life from dispatch to completion.")
    attempt_timeout = models.FloatField("attempt timeout (s)", default=30, help_text="Time limit of one attempt.")
    chat_scoped = models.BooleanField(
        "chat scoped", default=False, help_text="Messages of one chat run one at a time, in dispatch order."
    )
    chat_queue_size = models.PositiveIntegerField(
        "chat queue size", default=64, help_text="Most messages queued per chat."
    )
    max_payload_bytes = models.PositiveIntegerField("max payload bytes", default=65536)
    idempotency_window = models.PositiveIntegerField(
        "idempotency window (s)", default=86400, help_text="How long a dispatch's idempotency key is remembered."
    )
    enabled = models.BooleanField("enabled", default=True)
    shared = models.BooleanField(
        "shared between callers", default=False,
        help_text="Off (the default): each API token has its own chat ids, idempotency keys and limit keys for "
                  "this type, so no token can block, take or read another's. On: every caller's chat 'c1' is one "
                  "chat and every caller's key 'k' one key (for chats that several services write to); a token "
                  "can then queue behind, fill or take the keys of another caller's chats.",
    )
    class StoreResult(models.TextChoices):
        ALWAYS = "always", "always (every outcome has its result row)"
        FAILURES = "failures", "failures (rows only for dead letters and cancels)"
        NEVER = "never", "never (no result row; .get() reads the outcome from Redis for a while)"

    store_result = models.CharField(
        "store result", max_length=8, choices=StoreResult.choices, default=StoreResult.ALWAYS,
        help_text="Which outcomes get a row in the result table (Celery Results, the API's task state). A row "
                  "is a database write per task; without one, DispatchResult.get() reads the outcome Redis keeps "
                  "for a few minutes after the task ends.",
    )
    class Dedupe(models.TextChoices):
        KEY = "key", "key (idempotency: a key seen before answers its task)"
        THROTTLE = "throttle", "throttle (the first of a key in the window runs; the rest answer duplicate)"
        DEBOUNCE = "debounce", "debounce (each waits the window and replaces the one still waiting: the last runs)"

    dedupe = models.CharField(
        "dedupe", max_length=8, choices=Dedupe.choices, default=Dedupe.KEY,
        help_text="How dispatches sharing a key (dedupe_key, else the idempotency key) collapse. Throttle and "
                  "debounce go by the dedupe window; key is plain idempotency.",
    )
    dedupe_window = models.FloatField(
        "dedupe window (s)", default=0,
        help_text="Throttle: how long after the first dispatch of a key later ones answer duplicate. Debounce: "
                  "how long each waits for a newer one to replace it (its countdown). Unused for key.",
    )
    max_delay = models.FloatField(
        "max delay (s)", null=True, blank=True,
        help_text="Longest countdown / eta an API caller may ask for; empty: the type's timeout.",
    )
    options = models.JSONField(
        "options", default=dict, blank=True, help_text="Handler settings, checked by the handler."
    )
    batch_size = models.PositiveIntegerField(
        "batch size", default=100,
        help_text=f"Batched handlers only: most tasks one handler call takes (1..{MAX_BATCH_SIZE}).",
    )
    batch_window_ms = models.PositiveIntegerField(
        "batch window (ms)", default=5,
        help_text=f"Batched handlers only: how long a worker waits for more ready tasks to fill a batch "
                  f"(0..{MAX_BATCH_WINDOW_MS}).",
    )
    limits = models.ManyToManyField(
        Limit, through="TaskTypeLimit", blank=True, related_name="task_types", verbose_name="limits",
        help_text="Limits a task of this type must pass before it starts, checked in their order.",
    )

    class Meta:
        ordering = ["name"]

    def limit_names(self) -> list[str]:
        """The type's limits in their order (``position``)."""
        return [row.limit.name for row in self.limit_rows.select_related("limit").order_by("position", "id")]

    def set_limits(self, limits: list[Limit]) -> None:
        """Make ``limits`` (in order) this type's limits; each row saved, so the config version is bumped."""
        if [limit.pk for limit in limits] == [row.limit_id for row in self.limit_rows.order_by("position", "id")]:
            return
        self.limit_rows.all().delete()
        for position, limit in enumerate(limits):
            TaskTypeLimit.objects.create(task_type=self, limit=limit, position=position)

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.handler and self.handler not in registry.handler_names():
            known = ", ".join(registry.handler_names())
            errors["handler"] = f"Unknown handler '{self.handler}'; choose one of: {known}."
        if self.priority is not None and not 0 <= self.priority <= 9:
            errors["priority"] = "Priority must be between 0 and 9."
        if self.timeout is not None and not 0 < self.timeout <= MAX_TIMEOUT_S:
            errors["timeout"] = f"Timeout must be above 0 and at most {MAX_TIMEOUT_S:.0f} seconds."
        if self.attempt_timeout is not None and not 0 < self.attempt_timeout <= MAX_TIMEOUT_S:
            errors["attempt_timeout"] = f"Attempt timeout must be above 0 and at most {MAX_TIMEOUT_S:.0f} seconds."
        if ("timeout" not in errors and "attempt_timeout" not in errors and self.timeout is not None
                and self.attempt_timeout is not None and self.attempt_timeout > self.timeout):
            errors["attempt_timeout"] = (f"Attempt timeout ({self.attempt_timeout:g} s) must not be above the "
                                         f"timeout ({self.timeout:g} s), the task's whole life.")
        if self.chat_queue_size is not None and not 1 <= self.chat_queue_size <= 100000:
            errors["chat_queue_size"] = "Chat queue size must be between 1 and 100000."
        if self.batch_size is not None and not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            errors["batch_size"] = f"Batch size must be between 1 and {MAX_BATCH_SIZE}."
        if self.batch_window_ms is not None and not 0 <= self.batch_window_ms <= MAX_BATCH_WINDOW_MS:
            errors["batch_window_ms"] = f"Batch window must be between 0 and {MAX_BATCH_WINDOW_MS} ms."
        if self.max_delay is not None and not 0 <= self.max_delay <= MAX_TIMEOUT_S:
            errors["max_delay"] = f"Max delay must be between 0 and {MAX_TIMEOUT_S:.0f} seconds."
        if self.dedupe_window is not None and "timeout" not in errors:
            problem = dedupe_rules.window_problem(self.dedupe, self.dedupe_window, self.timeout)
            if problem:
                errors[problem[0]] = problem[1]
        if self.max_payload_bytes is not None and not 2 <= self.max_payload_bytes <= 8 * 1024 * 1024:
            errors["max_payload_bytes"] = "Max payload bytes must be between 2 and 8388608."
        if not isinstance(self.options, dict):
            errors["options"] = "Options must be a JSON object."
        elif not _valid_unicode(self.options):
            errors["options"] = "Options must be valid Unicode: a lone surrogate such as \\ud800 is not."
        elif self.handler in registry.handler_names():
            try:
                registry.validate_options(self.handler, self.options)
            except ValueError as exc:
                errors["options"] = str(exc)
        if errors:
            raise ValidationError(errors)


class TaskTypeLimit(models.Model):
    """One limit of a task type, at its place in the type's order.

    A ``through`` model rather than a JSON list of names: a limit in use cannot
    be deleted (PROTECT), the admin offers only existing limits, and renaming a
    limit needs no edit of the types naming it; ``position`` keeps the order.
    """

    task_type = models.ForeignKey(TaskType, on_delete=models.CASCADE, related_name="limit_rows",
                                  verbose_name="task type")
    limit = models.ForeignKey(Limit, on_delete=models.PROTECT, related_name="type_rows", verbose_name="limit",
                              help_text="A limit this type's tasks must pass.")
    position = models.PositiveSmallIntegerField("position", default=0,
                                                help_text="Order among the type's limits (lowest first).")

    class Meta:
        ordering = ["position", "id"]
        constraints = [models.UniqueConstraint(fields=["task_type", "limit"], name="tasktype_limit_once")]
        verbose_name = "limit of a task type"

    def __str__(self) -> str:
        return f"{self.task_type_id}:{self.limit_id}@{self.position}"


class DeadLetterQuerySet(models.QuerySet):
    def pending(self) -> DeadLetterQuerySet:
        return self.filter(status=DeadLetter.Status.DEAD)


class DeadLetter(models.Model):
    """A task that will not run again by itself: exhausted, expired, refused or poison."""

    class Status(models.TextChoices):
        DEAD = "dead", "dead"
        REQUEUED = "requeued", "requeued"
        DISCARDED = "discarded", "discarded"

    task_id = models.CharField("task id", max_length=64, unique=True)
    task_type = models.CharField("type", max_length=100, db_index=True)
    lane = models.CharField("lane", max_length=64, db_index=True)
    chat_id = models.CharField("chat id", max_length=128, blank=True, db_index=True)
    payload = models.JSONField("payload", null=True)
    idempotency_key = models.CharField("idempotency key", max_length=200, blank=True, db_index=True)
    metadata = models.JSONField("metadata", default=dict, blank=True)
    priority = models.PositiveSmallIntegerField("priority", default=5)
    reason = models.CharField("reason", max_length=32, db_index=True)
    error_class = models.CharField("error class", max_length=200, blank=True)
    error_message = models.TextField("error message", blank=True)
    traceback = models.TextField("traceback", blank=True)
    attempts = models.PositiveIntegerField("attempts", default=0)
    dispatched_at = models.DateTimeField("first dispatched", null=True)
    died_at = models.DateTimeField("died", auto_now_add=True, db_index=True)
    status = models.CharField("status", max_length=16, choices=Status.choices, default=Status.DEAD, db_index=True)
    requeued_task_id = models.CharField("requeued as", max_length=64, blank=True)
    resolved_at = models.DateTimeField("resolved", null=True, blank=True)
    resolved_by = models.CharField("resolved by", max_length=150, blank=True)

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        ordering = ["-died_at"]
        permissions = [("requeue_deadletter", "Can requeue or discard dead letters")]

    def __str__(self) -> str:
        return f"{self.task_type} {self.task_id} ({self.reason})"
