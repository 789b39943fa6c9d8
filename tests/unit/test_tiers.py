"""The unit tier needs neither Redis nor a database, and a unit test cannot quietly start using them."""

from __future__ import annotations

import pytest
import redis

from tests.conftest import ROOT, needs_services


def test_a_unit_test_that_reaches_for_redis_is_told_where_it_belongs():
    with pytest.raises(AssertionError, match="tests/integration"):
        redis.Redis(host="127.0.0.1", port=1).ping()


def test_a_unit_test_that_opens_the_database_is_told_where_it_belongs():
    from django.db import connection

    with pytest.raises(AssertionError, match="tests/integration"):
        connection.ensure_connection()


def test_only_a_session_with_a_test_outside_the_unit_tier_starts_the_services():
    unit, integration = ROOT / "tests/unit/test_retry.py", ROOT / "tests/integration/test_fifo.py"
    assert not needs_services([unit, ROOT / "tests/unit/test_layers.py"])
    assert needs_services([unit, integration]) and needs_services([ROOT / "tests/faults/test_redis.py"])
