"""Service tokens (who may call the API, for which task types) and the audit of dispatches."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from api import tokens


def default_rate() -> int:
    return settings.DISPATCH_API_RATE_PER_S


class ServiceTokenQuerySet(models.QuerySet):
    def active(self) -> ServiceTokenQuerySet:
        return self.filter(revoked_at__isnull=True)

    def issue(self, name: str, task_types: list[str], *, rate_per_s: int | None = None,
              notes: str = "", retry_policies: Sequence[str] = (),
              reads_broker_tasks: bool = False, lane_share: int = 100) -> tuple[ServiceToken, str]:
        """Create a token for ``task_types`` (names); returns the row and the clear token, which is not kept."""
        from tasks.models import RetryPolicy, TaskType

        policies = list(RetryPolicy.objects.filter(name__in=retry_policies))
        unknown = sorted(set(retry_policies) - {p.name for p in policies})
        if unknown:
            raise ValueError(f"no retry policy named {', '.join(unknown)}")
        found = list(TaskType.objects.filter(name__in=task_types))
        missing = sorted(set(task_types) - {t.name for t in found})
        if missing:
            raise ValueError(f"no task type named {', '.join(missing)}")
        row = ServiceToken(name=name, notes=notes, reads_broker_tasks=reads_broker_tasks, lane_share=lane_share)
        if rate_per_s is not None:
            row.rate_per_s = rate_per_s
        clear = row.set_new_secret()
        row.full_clean()
        row.save()
        row.task_types.set(found)
        row.retry_policies.set(policies)
        return row, clear


class ServiceToken(models.Model):
    """One calling service's bearer token; the clear token is shown once and never stored."""

    name = models.CharField("name", max_length=100, unique=True, help_text="The calling service, e.g. 'billing'.")
    notes = models.TextField("owner / notes", blank=True, help_text="Who owns this service, how to reach them.")
    prefix = models.CharField(
        "prefix", max_length=16, unique=True, editable=False,
        help_text="The public start of the token (dsp_<prefix>_...), used to find it.",
    )
    secret_hash = models.CharField(
        "secret hash", max_length=64, editable=False, help_text="SHA-256 of the secret part; the secret is not kept.",
    )
    task_types = models.ManyToManyField(
        "tasks.TaskType", blank=True, related_name="service_tokens", verbose_name="allowed task types",
        help_text="The types this token may dispatch; any other is refused with 403.",
    )
    rate_per_s = models.PositiveIntegerField(
        "rate limit (tasks/s)", default=default_rate,
        help_text="Tasks (and reads) per second this token may send, across all web processes: a bulk request "
                  "of 1,000 items counts 1,000.",
    )
    retry_policies = models.ManyToManyField(
        "tasks.RetryPolicy", blank=True, related_name="service_tokens", verbose_name="retry policies it may name",
        help_text="The policies a dispatch of this token may name in retry_policy; any other is refused with 403. "
                  "Without one, its tasks follow their type's policy.",
    )
    lane_share = models.PositiveSmallIntegerField(
        "share of each lane (%)", default=100, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="The most of a lane's capacity this token's tasks may hold at once, in per cent (1-100): its "
                  "tasks not started yet (waiting, sent for later, behind a chat's head, waiting on a limit or a "
                  "retry), as the capacity counts them. Past it a dispatch is refused with 429 caller_quota, so "
                  "one caller cannot fill a lane others share. At least one task always fits; 100: the whole lane.",
    )
    reads_broker_tasks = models.BooleanField(
        "reads tasks sent by name", default=False,
        help_text="Also read (GET /api/v1/tasks/<id>) tasks no token made: those sent by name through the broker "
                  "(tasks.dispatch) or by Python code. Off: a token reads only its own tasks.",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    last_used_at = models.DateTimeField(
        "last used", null=True, blank=True, help_text="Updated at most once a minute.",
    )
    revoked_at = models.DateTimeField("revoked", null=True, blank=True, help_text="A revoked token is refused.")

    objects = ServiceTokenQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = "service token"

    def __str__(self) -> str:
        return f"{self.name} (dsp_{self.prefix}_…)" if self.prefix else self.name

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def set_new_secret(self) -> str:
        """Give this row a new prefix and secret hash; returns the clear token (show it once)."""
        made = tokens.new_token()
        self.prefix, self.secret_hash = made.prefix, made.secret_hash
        return made.token

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class DispatchAudit(models.Model):
    """One row per API request that reached admission: who sent what, and what came of it."""

    token = models.ForeignKey(
        ServiceToken, null=True, on_delete=models.SET_NULL, related_name="audits", verbose_name="token",
    )
    token_name = models.CharField("token name", max_length=100, help_text="Kept if the token is deleted.")
    endpoint = models.CharField("endpoint", max_length=16, help_text="'dispatch' or 'bulk'.")
    task_type = models.CharField("task type", max_length=100, db_index=True)
    items = models.PositiveIntegerField("items", help_text="Tasks in the request.")
    accepted = models.PositiveIntegerField("accepted", help_text="Tasks admitted (duplicates included).")
    reasons = models.JSONField("rejections", default=dict, blank=True, help_text="Count of each rejection reason.")
    task_ids = models.JSONField(
        "task ids", default=list, blank=True, help_text="Ids of admitted tasks (the first 100 of a request).",
    )
    remote_addr = models.CharField("remote address", max_length=64, blank=True)
    created_at = models.DateTimeField("time", auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API dispatch audit"
        verbose_name_plural = "API dispatch audit"

    def __str__(self) -> str:
        return f"{self.token_name} {self.endpoint} {self.task_type} {self.accepted}/{self.items}"
