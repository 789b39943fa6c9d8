from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask

from tasks import dedupe as dedupe_rules
from tasks import registry, schedules
from tasks.retry import MAX_TIMEOUT_S
from tasks.validation import MAX_CHAT_ID_LEN, MAX_LIMIT_KEY_LEN, is_clean_text, unstorable_text

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


#: Shortest idempotency window a scheduled type may have, in seconds: a fire's key must outlive
#: the race of two beats and a beat's restart between its dispatch and its record.
MIN_SCHEDULE_KEY_WINDOW_S = 300
#: The Celery task name the derived PeriodicTask names (tasks.beat.fire_schedule).
FIRE_TASK = "tasks.fire_schedule"
#: Prefix of the derived PeriodicTask's name (its names are unique across beat's table).
PERIODIC_PREFIX = "schedule:"


class Schedule(models.Model):
    """A platform task type fired by beat through admission, on an interval, a crontab or once.

    Our model sits beside django-celery-beat's ``PeriodicTask`` rather than in its
    ``kwargs`` text: the task type is a foreign key (a type in use cannot be deleted
    from under a schedule), payload, chat id, limit key and priority are fields the
    admin and config files validate like a dispatch, and the fire state (last due
    time, outcome, counts) has a row to live in. The ``PeriodicTask`` is derived on
    every save (``sync_periodic_task``): it is what the DatabaseScheduler wakes for,
    and its ``IntervalSchedule`` / ``CrontabSchedule`` / ``ClockedSchedule`` are
    the definitions, edited with django-celery-beat's own admin widgets.
    """

    class Missed(models.TextChoices):
        ONCE = "once", "once (one catch-up fire after a gap)"
        SKIP = "skip", "skip (a late due time is not fired)"

    class Outcome(models.TextChoices):
        NONE = "", "-"
        FIRED = "fired", "fired"
        REFUSED = "refused", "refused"
        SKIPPED = "skipped", "skipped"

    name = models.CharField("name", max_length=100, unique=True, validators=[validate_type_name])
    task_type = models.ForeignKey(TaskType, on_delete=models.PROTECT, related_name="schedules",
                                  verbose_name="task type", help_text="What each fire dispatches.")
    payload = models.JSONField("payload", default=dict, blank=True,
                               help_text="A JSON object, sent as each fire's payload.")
    chat_id = models.CharField("chat id", max_length=MAX_CHAT_ID_LEN, blank=True,
                               help_text="The chat each fire is queued in (a chat-scoped type needs one).")
    limit_key = models.CharField("limit key", max_length=MAX_LIMIT_KEY_LEN, blank=True,
                                 help_text="The key of the type's per-key limit, if it has one.")
    priority = models.PositiveSmallIntegerField("priority", null=True, blank=True,
                                                help_text="0..9; empty: the task type's priority.")
    interval = models.ForeignKey(IntervalSchedule, on_delete=models.PROTECT, null=True, blank=True,
                                 verbose_name="interval",
                                 help_text="Every N periods (one of interval, crontab, one-off).")
    crontab = models.ForeignKey(CrontabSchedule, on_delete=models.PROTECT, null=True, blank=True,
                                verbose_name="crontab", help_text="Minutes, hours, days in the crontab's time zone.")
    clocked = models.ForeignKey(ClockedSchedule, on_delete=models.PROTECT, null=True, blank=True,
                                verbose_name="one-off", help_text="Once, at this time.")
    missed = models.CharField("missed fires", max_length=4, choices=Missed.choices, default=Missed.ONCE,
                              help_text="A due time passed while no beat ran (or late past its grace): "
                                        "fired once on return, or skipped. Never a burst.")
    enabled = models.BooleanField("enabled", default=True, help_text="Off: paused (a resume does not catch up).")
    anchor_at = models.DateTimeField("interval anchor", default=timezone.now, editable=False,
                                     help_text="An interval's due times are this plus whole periods.")
    since_at = models.DateTimeField("counted since", default=timezone.now, editable=False,
                                    help_text="Due times before this (created or resumed) are not this schedule's.")
    periodic_task = models.OneToOneField(PeriodicTask, on_delete=models.SET_NULL, null=True, blank=True,
                                         editable=False, related_name="platform_schedule")
    last_due_at = models.DateTimeField("last due time", null=True, blank=True, editable=False,
                                       help_text="The last due time decided (fired, refused or skipped).")
    last_fired_at = models.DateTimeField("last decided at", null=True, blank=True, editable=False)
    last_outcome = models.CharField("last outcome", max_length=8, choices=Outcome.choices, blank=True,
                                    editable=False)
    last_reason = models.CharField("last reason", max_length=500, blank=True, editable=False,
                                   help_text="Why the last fire was refused or skipped.")
    last_task_id = models.CharField("last task id", max_length=64, blank=True, editable=False)
    fired_count = models.PositiveIntegerField("fired", default=0, editable=False)
    refused_count = models.PositiveIntegerField("refused", default=0, editable=False)
    skipped_count = models.PositiveIntegerField("skipped", default=0, editable=False,
                                                help_text="Due times not fired: late under 'skip', or jumped over.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def kind(self) -> str:
        """Which definition the schedule has: ``interval``, ``crontab``, ``clocked`` or ''."""
        return next((k for k in ("interval", "crontab", "clocked") if getattr(self, f"{k}_id") is not None), "")

    def clean(self) -> None:
        errors: dict[str, str] = {}
        kinds = [k for k in ("interval", "crontab", "clocked") if getattr(self, f"{k}_id") is not None]
        if len(kinds) != 1:
            message = ("Set exactly one of interval, crontab and one-off." if kinds
                       else "Set one of interval, crontab or one-off.")
            errors.update({k: message for k in kinds or ["interval"]})
        if not isinstance(self.payload, dict):
            errors["payload"] = f"Payload must be a JSON object, not {type(self.payload).__name__}."
        else:
            try:
                json.dumps(self.payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
            except (ValueError, UnicodeEncodeError) as exc:
                errors["payload"] = f"Payload is not valid JSON text: {exc}."
            else:
                # What dispatch refuses (PostgreSQL's jsonb cannot hold NUL): each fire would be refused.
                where = unstorable_text(self.payload, "payload")
                if where:
                    errors["payload"] = f"Payload cannot be stored: {where}."
        if self.chat_id and not is_clean_text(self.chat_id, MAX_CHAT_ID_LEN):
            errors["chat_id"] = f"Chat id must be 1..{MAX_CHAT_ID_LEN} printable characters."
        if self.limit_key and not is_clean_text(self.limit_key, MAX_LIMIT_KEY_LEN):
            errors["limit_key"] = f"Limit key must be 1..{MAX_LIMIT_KEY_LEN} printable characters."
        if self.priority is not None and not 0 <= self.priority <= 9:
            errors["priority"] = "Priority must be 0..9 (or empty for the type's)."
        task_type = self.task_type if self.task_type_id is not None else None
        if task_type is not None:
            if task_type.idempotency_window < MIN_SCHEDULE_KEY_WINDOW_S:
                errors["task_type"] = (f"Task type '{task_type.name}' keeps idempotency keys "
                                       f"{task_type.idempotency_window} s; a schedule needs at least "
                                       f"{MIN_SCHEDULE_KEY_WINDOW_S} s (each fire's key is what stops two beats "
                                       f"firing one due time twice).")
            if task_type.chat_scoped and not self.chat_id:
                errors["chat_id"] = f"Task type '{task_type.name}' is chat-scoped: a chat id is required."
            if isinstance(self.payload, dict) and "payload" not in errors:
                size = len(json.dumps(self.payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
                if size > task_type.max_payload_bytes:
                    errors["payload"] = (f"Payload is {size} bytes; '{task_type.name}' allows "
                                         f"{task_type.max_payload_bytes}.")
        if errors:
            raise ValidationError(errors)

    def definition(self) -> schedules.Definition:
        """The pure definition of the schedule's due times (``tasks.schedules``)."""
        if self.interval is not None:
            every = timedelta(**{self.interval.period: self.interval.every})
            return schedules.Interval(every_us=every // timedelta(microseconds=1), anchor=self.anchor_at)
        if self.crontab is not None:
            cron = self.crontab.schedule  # celery's crontab: each field expanded to a set of ints
            return schedules.Cron(minutes=frozenset(cron.minute), hours=frozenset(cron.hour),
                                  days_of_week=frozenset(cron.day_of_week),
                                  days_of_month=frozenset(cron.day_of_month),
                                  months=frozenset(cron.month_of_year), zone=str(self.crontab.timezone))
        if self.clocked is not None:
            return schedules.OneOff(at=self.clocked.clocked_time)
        raise ValueError(f"schedule {self.name!r} has no interval, crontab or one-off")

    def decide(self, now: datetime) -> schedules.Decision:
        since = None if self.clocked_id is not None else self.since_at
        return schedules.decide(self.definition(), now, last_due=self.last_due_at, since=since,
                                policy=self.missed)

    def next_fire(self, now: datetime | None = None) -> datetime | None:
        """When the schedule fires next (None: paused, or a one-off that has fired)."""
        if not self.enabled or not self.kind():
            return None
        now = now or datetime.now(UTC)
        decision = self.decide(now)
        return decision.due if decision.action == "fire" else decision.next_due

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the definition; an existing row's fire state is beat's (``tasks.beat``) and is left as stored.

        An admin form opened before a fire and saved after it would otherwise
        write the old last due time and counts back.
        """
        if self.pk is not None and not kwargs.get("force_insert") and kwargs.get("update_fields") is None:
            was = Schedule.objects.filter(pk=self.pk).values_list("enabled", flat=True).first()
            if was is not None:
                if self.enabled and was is False:  # resumed: the paused span is not caught up
                    self.since_at = timezone.now()
                kwargs["update_fields"] = DEFINITION_FIELDS
        if self.pk is None:
            self.anchor_at = self.anchor_at.replace(microsecond=0)
        super().save(*args, **kwargs)
        sync_periodic_task(self)


#: What a save of an existing schedule writes (the rest is its fire state, written by beat).
DEFINITION_FIELDS = ("name", "task_type", "payload", "chat_id", "limit_key", "priority", "interval", "crontab",
                     "clocked", "missed", "enabled", "since_at")


def sync_periodic_task(schedule: Schedule) -> PeriodicTask:
    """Create or update the PeriodicTask beat wakes for (its save tells running beats of the change)."""
    fields = {
        "name": f"{PERIODIC_PREFIX}{schedule.name}", "task": FIRE_TASK,
        "kwargs": json.dumps({"schedule_id": schedule.pk}), "enabled": schedule.enabled,
        "interval": schedule.interval, "crontab": schedule.crontab, "clocked": schedule.clocked,
        "one_off": schedule.clocked_id is not None,
        "description": f"Fires the platform schedule {schedule.name!r} (edit it under Tasks > Schedules).",
    }
    task = schedule.periodic_task or PeriodicTask.objects.filter(name=fields["name"]).first() or PeriodicTask()
    for field, value in fields.items():
        setattr(task, field, value)
    task.save()
    if schedule.periodic_task_id != task.pk:
        Schedule.objects.filter(pk=schedule.pk).update(periodic_task=task)
        schedule.periodic_task = task
    return task


def drop_periodic_task(sender: object, instance: Schedule, **kwargs: object) -> None:
    """A deleted schedule's PeriodicTask goes too (connected by ``tasks.receivers.connect``)."""
    if instance.periodic_task_id is not None:
        PeriodicTask.objects.filter(pk=instance.periodic_task_id).delete()
