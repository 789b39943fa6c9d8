"""The measuring tools' tables: the SMS demo's messages (seed 004)."""

from __future__ import annotations

from django.db import models


class SmsMessage(models.Model):
    """One SMS the demo supplier accepted: written once per message, in one insert per batch."""

    key = models.CharField("idempotency key", max_length=200, unique=True,
                           help_text="The message's identity: a re-send finds it here and is not sent again.")
    task_id = models.CharField("task id", max_length=64, help_text="The task that submitted it.")
    channel = models.CharField("channel", max_length=64, help_text="The supplier channel it went through.")
    to = models.CharField("to", max_length=32, help_text="The destination number.")
    submit_id = models.CharField("submit id", max_length=64, help_text="The supplier's id for the submission.")
    attempt = models.PositiveIntegerField("attempt", default=1, help_text="The task attempt that wrote the row.")
    created_at = models.DateTimeField("created", auto_now_add=True)

    class Meta:
        verbose_name = "SMS message (demo)"

    def __str__(self) -> str:
        return f"{self.key} -> {self.submit_id}"
