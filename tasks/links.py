"""Links into the admin that messages for people carry (a dead letter's failure, for one)."""

from __future__ import annotations

from urllib.parse import quote


def dead_letter_admin_url(task_id: str, admin_url: str | None = None) -> str:
    """The admin's dead-letter list filtered to one task id (``DISPATCH_ADMIN_URL`` unless given)."""
    if admin_url is None:
        from django.conf import settings

        admin_url = settings.DISPATCH_ADMIN_URL
    base = admin_url if admin_url.endswith("/") else admin_url + "/"
    return f"{base}tasks/deadletter/?task_id={quote(task_id, safe='')}"
