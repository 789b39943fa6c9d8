"""The admin forms' property tests again, with the whole test session on PostgreSQL.

PostgreSQL refuses what SQLite stores (NUL in text, integers past 2**31 in an
``integer`` column), so a form that lets those through shows up here as a 500.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.postgres_server import find_bindir
from tests.support.workers import ROOT

pytestmark = pytest.mark.skipif(
    find_bindir() is None and not os.environ.get("CI"),
    reason="PostgreSQL is not installed: apt-get install postgresql (CI installs it)",
)


def test_admin_properties_on_postgres():
    from tests.support.postgres_server import PostgresServer

    server = PostgresServer().start()
    try:
        env = {**os.environ, "TEST_DATABASE_URL": server.url, "HYPOTHESIS_EXAMPLES":
               os.environ.get("HYPOTHESIS_EXAMPLES", "40")}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/integration/test_admin_properties.py"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    # Every property of the admin's forms ran there, none skipped.
    props = sum(1 for line in (ROOT / "tests/integration/test_admin_properties.py").read_text().splitlines()
                if line.startswith("def test_"))
    assert f"{props} passed" in done.stdout, done.stdout[-2000:]
