"""Issue 12: the CLI's audit actor is the OS user running it, not what ``$USER`` claims."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

from tasks.models import DeadLetter
from tests.support.helpers import unique
from tests.support.workers import ROOT


def test_deadletters_records_the_real_user_whatever_user_says():
    row = DeadLetter.objects.create(task_id=unique("actor-dl"), task_type="t", lane="t-default",
                                    reason="exhausted", payload={"a": 1})
    env = {**os.environ, "USER": "mallory", "LOGNAME": "mallory", "LNAME": "mallory", "USERNAME": "mallory"}
    out = subprocess.run([sys.executable, "manage.py", "deadletters", "--discard", str(row.pk)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    row.refresh_from_db()
    assert row.status == DeadLetter.Status.DISCARDED
    assert row.resolved_by == f"shell:{pwd.getpwuid(os.getuid()).pw_name}"
