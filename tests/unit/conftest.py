"""The unit tier: pure logic, no Redis and no database (``make test-fast`` starts neither).

A unit test that connects to Redis or opens the database fails here, naming the tier it
belongs to, in a unit-only run and in a full one alike (where the other tiers started both).
"""

from __future__ import annotations

import pytest

MOVE = "unit tests run without Redis or a database: this test belongs in tests/integration"


@pytest.fixture(autouse=True)
def _no_redis_nor_database(monkeypatch):
    import redis.connection
    from django.db.backends.base.base import BaseDatabaseWrapper

    def refuse(*args, **kwargs):
        raise AssertionError(MOVE)

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", refuse)
    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", refuse)
