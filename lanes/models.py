from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.db import models

LANE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
RESERVED_QUEUES = {"ingress", "celery"}
#: Keys kombu's Redis transport keeps beside the queues (kombu/transport/redis.py: unacked_key,
#: unacked_index_key, unacked_mutex_key). A lane of that name turns one into a list, and every
#: worker's recovery sweep then fails with WRONGTYPE, for every lane.
RESERVED_KOMBU_KEYS = {"unacked", "unacked_index", "unacked_mutex"}
#: Name prefixes of keys kombu and Celery own: binding tables (keyprefix_queue ``_kombu.binding.%s``,
#: ``_kombu.binding_deadlines``, ``_kombu.binding_permanent.%s``), event queues, result keys.
RESERVED_PREFIXES = ("_kombu.", "celeryev.", "celery-task-meta-", "celery-taskset-meta-", "chord-unlock")
#: Name suffixes of remote-control queues (``celery.pidbox`` and its ``*.reply.celery.pidbox`` replies).
RESERVED_SUFFIXES = (".pidbox",)


def validate_lane_name(value: str) -> None:
    # ':' is refused here too: kombu stores a lane's priorities as lists named
    # ``lane:1``..``lane:9`` (sep ':'), so a lane ``x:3`` would be lane x's priority list.
    if not LANE_NAME_RE.match(value or ""):
        raise ValidationError(
            "Lane name must be 1-64 letters, digits, '_', '.' or '-' (it is the Celery queue name; "
            "':' is reserved for priority sub-queues)."
        )
    if value in RESERVED_QUEUES:
        raise ValidationError(f"'{value}' is reserved for the platform's own queue.")
    if value in RESERVED_KOMBU_KEYS or value.startswith(RESERVED_PREFIXES) or value.endswith(RESERVED_SUFFIXES):
        raise ValidationError(
            f"'{value}' is reserved: kombu's Redis transport or Celery keeps a key of that name "
            "(a lane of that name would break message recovery for every lane)."
        )


class Lane(models.Model):
    """A Celery queue with a bound: tasks of a lane wait and run apart from other lanes."""

    name = models.CharField(
        "name", max_length=64, unique=True, validators=[validate_lane_name],
        help_text="The Celery queue name; workers serve it with `-Q name`.",
    )
    capacity = models.PositiveIntegerField(
        "capacity", default=10000,
        help_text="Most tasks waiting in the lane (all priorities, chat backlogs and scheduled retries).",
    )
    accepting = models.BooleanField(
        "accepting", default=True, help_text="When off, dispatch answers `lane_closed`."
    )
    description = models.TextField("description", blank=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            ("control_lane", "Can close, open, pause, resume and drain lanes"),
            # Flower shuts workers down, revokes tasks and shows every payload: more than staff.
            ("use_flower", "Can use Flower (control workers, revoke tasks, read payloads)"),
            # Cancelling a task or a chat's queue (the admin's task search); a lane purge needs control_lane.
            ("cancel_task", "Can cancel tasks and chats"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.capacity is not None and self.capacity < 1:
            raise ValidationError({"capacity": "Capacity must be at least 1."})


class LaneEvent(models.Model):
    """Who changed a lane's state, and when (close/open/pause/resume/drain)."""

    lane = models.CharField("lane", max_length=64)
    action = models.CharField("action", max_length=16)
    actor = models.CharField("actor", max_length=150, help_text="User name, or `shell:<user>` for the CLI.")
    detail = models.TextField("detail", blank=True)
    created = models.DateTimeField("at", auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.created:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.lane}"


class ConfigRevision(models.Model):
    """One row counting configuration changes, bumped in the same transaction as the change.

    Redis's config version tells running processes about a change at once; this
    counter is the database's own record, which each process compares every few
    seconds, so a change whose Redis bump was lost (Redis unreachable) is still
    picked up without another save.
    """

    revision = models.PositiveBigIntegerField(
        "revision", default=0, help_text="Incremented by every save or delete of a lane, retry policy or task type.",
    )

    class Meta:
        verbose_name = "configuration revision"

    def __str__(self) -> str:
        return f"revision {self.revision}"
