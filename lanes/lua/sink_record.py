"""``sink_record.lua``'s wrapper: the load-test sink's record of one applied message.

The script belongs to the measuring tools; the loader takes the directory it
lives in (``directory``), so it can move there with this wrapper.
"""

from __future__ import annotations

from pathlib import Path

from lanes.lua.loader import SCRIPT_DIR, call

NAME = "sink_record"


def sink_record(*, applied_key: str, log_key: str, idempotency_key: str, line: str, ttl_s: int, max_entries: int,
                directory: Path = SCRIPT_DIR) -> None:
    """Count ``idempotency_key`` as applied and log ``line`` (KEYS/ARGV in the script's header)."""
    call(NAME, [applied_key, log_key], [idempotency_key, line, ttl_s, max_entries], directory)
