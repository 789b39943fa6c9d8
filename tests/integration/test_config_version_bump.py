"""A config save whose Redis version bump fails is surfaced, and still picked up (issue 12, item 3)."""

from __future__ import annotations

import json

import pytest
import redis
from django.core.management import CommandError, call_command
from redis.backoff import NoBackoff
from redis.retry import Retry

from lanes.models import Lane
from tests.support.helpers import define, unique, wait_until
from tests.support.redis_server import free_port


@pytest.fixture
def redis_unreachable(monkeypatch):
    """``redis_unreachable(True)``: every get_redis() points at a closed port; ``(False)``: Redis is back.

    The shared client is swapped, not the function (a module imported meanwhile binds ``get_redis`` by name:
    see test_admin_config_bump)."""
    import lanes.redis_client

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2,
                       retry=Retry(NoBackoff(), 0))
    real = lanes.redis_client.get_redis()
    return lambda down: monkeypatch.setattr(lanes.redis_client, "_client", dead if down else real)


def test_closing_a_lane_with_redis_unreachable_says_so_and_is_seen_later(redis_unreachable, monkeypatch):
    from lanes.config_version import ConfigVersionNotPublished
    from tasks import config

    monkeypatch.setattr(config, "DB_CHECK_INTERVAL_S", 0.5)
    name = unique("cvb")
    define(name, lane=f"{name}-lane")
    config.reload()
    assert config.current().lanes[f"{name}-lane"].accepting  # this process caches the open lane

    redis_unreachable(True)
    with pytest.raises(ConfigVersionNotPublished, match="saved, but Redis did not get"):
        lane = Lane.objects.get(name=f"{name}-lane")
        lane.accepting = False
        lane.save()
    assert not Lane.objects.get(name=f"{name}-lane").accepting  # the change itself is kept

    redis_unreachable(False)  # Redis is back; no one saves anything again
    wait_until(lambda: not config.current().lanes[f"{name}-lane"].accepting, timeout=10,
               what="the cached config to notice the closed lane")


def test_apply_config_exits_with_an_error_when_the_bump_fails(redis_unreachable, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"lanes": [{"name": unique("cvb")}]}))
    redis_unreachable(True)
    with pytest.raises(CommandError, match="Redis did not get the new config version"):
        call_command("apply_config", str(path))
