"""A counters flush while Redis is out of reach (a closed port): one line in the log, the counts kept."""

from __future__ import annotations

import logging
import socket
import time

import redis

from lanes import counters


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connecting is refused


def test_a_flush_redis_refuses_logs_one_line_and_keeps_its_counts(caplog):
    port = _closed_port()
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    before = counters.pending()
    counters.add("offline_test|x", time.time())  # its flusher may start; the flush below is ours
    with caplog.at_level(logging.WARNING, logger="lanes.counters"):
        assert counters.flush(client) == 0
    # Ours: the flush that met the closed port (the flusher thread add() started meets the unit tier's guard).
    failed = [r for r in caplog.records if r.getMessage().startswith("counters_flush_failed")
              and f":{port}" in r.getMessage()]
    assert failed and not any(r.exc_info for r in failed), "a refused connection says so in one line, no traceback"
    assert counters.pending() >= before + 1  # kept for the next flush
