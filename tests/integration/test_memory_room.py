"""Redis memory and the room left in tasks, on /metrics, the dashboard and ``manage.py lanes``."""

from __future__ import annotations

import io
import re

from django.core.management import call_command

from lanes import capacity


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_memory_used_and_room_are_shown_against_maxmemory(rc, admin_client):
    before = rc.config_get("maxmemory")["maxmemory"]
    maxmemory = int(rc.info("memory")["used_memory"]) + 64 * 1024 * 1024
    try:
        rc.config_set("maxmemory", maxmemory)
        text = admin_client.get("/metrics").content.decode()
        used = _gauge(text, "dispatch_redis_used_memory_bytes")
        assert _gauge(text, "dispatch_redis_maxmemory_bytes") == maxmemory
        limit = _gauge(text, "dispatch_redis_memory_limit_bytes")
        assert limit == int(maxmemory * 0.9)
        per_task = _gauge(text, "dispatch_redis_bytes_per_waiting_task")
        room = _gauge(text, "dispatch_redis_room_tasks")
        assert per_task >= capacity.PATHS["plain"].bytes_waiting * 0.5
        assert abs(room - (limit - used) / per_task) <= 0.01 * room + 50

        html = admin_client.get("/admin/dashboard/").content.decode()
        shown = re.search(r'id="redis-memory"[^>]*>Redis memory ([^<]+) of ([^<]+), room for (\d+) more', html)
        assert shown, "the dashboard shows no Redis memory"
        assert shown.group(2) == f"{limit / 1024 / 1024:.1f} MiB"

        out = io.StringIO()
        call_command("lanes", stdout=out)
        assert re.search(r"redis memory: .* used, admission refuses at .* \(maxmemory\); room: [\d,]+ tasks",
                         out.getvalue()), out.getvalue()[-500:]
    finally:
        rc.config_set("maxmemory", before)
