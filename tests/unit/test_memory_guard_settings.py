"""``lanes.memory_guard.refusal`` reads no Django setting per call: ``DISPATCH_MEMORY_HIGH`` and
``DISPATCH_MEMORY_CHECK_S`` come with each ``INFO`` reading (a read of ``django.conf.settings`` is Python
code run per attribute, about 5K instructions: two of them were a twentieth of a lone dispatch's CPU)."""

from __future__ import annotations

import time

import pytest

from lanes import memory_guard


class _NoSettings:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"settings.{name} read per call")


@pytest.fixture
def reading(monkeypatch):
    monkeypatch.setattr(memory_guard, "_reading", memory_guard._Reading())
    monkeypatch.setattr(memory_guard, "settings", _NoSettings())
    return memory_guard._reading


@pytest.mark.parametrize("maxmemory", [0, 1 << 30])
def test_a_call_between_readings_reads_no_setting(reading, maxmemory):
    now = time.monotonic()
    reading.at, reading.high, reading.check_s = now, 0.9, 1.0
    reading.maxmemory, reading.used, reading.read = maxmemory, 1 << 20, 1 << 20
    assert memory_guard.refusal(1, now + 0.5) is None


def test_the_high_share_read_with_the_reading_refuses(reading):
    now = time.monotonic()
    reading.at, reading.high, reading.check_s = now, 0.5, 1.0
    reading.maxmemory = 1 << 30
    reading.used = reading.read = int(0.6 * (1 << 30))
    reading.at = now + 1.0  # the reading after the near-limit check: no INFO needed for this call
    detail = memory_guard.refusal(1, now + 1.0)
    assert detail and "50%" in detail
