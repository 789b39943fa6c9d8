"""``make test``: the whole suite as two pytest sessions running side by side.

Most of the suite's time is waiting (fixed sleeps, condition polls, worker starts), so two sessions at
once take far less wall time than one after the other on two cores. Each session has its own
redis-server and SQLite file (``tests/conftest.py`` makes both per session), its own fault-campaign
results file, and its own log in ``test-artifacts/session-<name>.log``; the logs are printed one after
the other when both have ended, then one summary line per session.

The split is static and simple: session ``a`` runs ``tests/unit``, ``tests/faults`` and every other
file of ``tests/integration``; session ``b`` the browser tier (one Chromium) and the rest of
``tests/integration``. Options (``make test PYTEST_ARGS="-x -k fifo"``) go to both sessions; when
``PYTEST_ARGS`` names a test path, that is one ordinary session, as before.

Exit status: non-zero when either session fails; 5 (pytest's "no tests ran") when neither ran a test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
ARTIFACTS = ROOT / "test-artifacts"
NO_TESTS = 5  # pytest's exit status when nothing was collected


def names_a_path(args: list[str]) -> bool:
    """Whether the pytest arguments name a test file or folder (then the caller chose what to run)."""
    return any(not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists() for arg in args)


def split() -> dict[str, list[str]]:
    """The two sessions' test paths, relative to the project: whole tiers, and ``tests/integration``'s
    files alternated between them (sorted, so a name says where a file runs)."""
    integration = sorted(str(p.relative_to(ROOT)) for p in (TESTS / "integration").glob("test_*.py"))
    return {"a": ["tests/unit", "tests/faults", *integration[0::2]],
            "b": ["tests/browser", *integration[1::2]]}


def start(name: str, paths: list[str], args: list[str]) -> tuple[subprocess.Popen, Path]:
    log = ARTIFACTS / f"session-{name}.log"
    env = dict(os.environ)
    # The fault tier appends each scenario's row to one results file: one a session.
    env.setdefault("FAULTS_RESULTS", str(ARTIFACTS / f"faults-results-{name}.jsonl"))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", *paths, *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def summary_of(text: str) -> str:
    """pytest's closing line (``3 failed, 412 passed in 401.2s``; framed by ``=`` unless ``-q``), or a note
    that there was none."""
    lines = re.findall(r"^=* ?((?:\d+ \w+|no tests ran)\b.* in [\d.]+s\b.*?) ?=*$", text, re.M)
    return lines[-1] if lines else "no summary line (the session did not finish; see its log above)"


def main(args: list[str]) -> int:
    if names_a_path(args):
        return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT)
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.monotonic()
    sessions = {name: start(name, paths, args) for name, paths in split().items()}
    print(f"make test: {len(sessions)} pytest sessions side by side; follow them with "
          f"tail -f {' '.join(str(log.relative_to(ROOT)) for _, log in sessions.values())}", flush=True)
    ended: dict[str, tuple[int, float]] = {}
    try:
        while len(ended) < len(sessions):
            for name, (proc, _) in sessions.items():
                if name not in ended and proc.poll() is not None:
                    ended[name] = (proc.returncode, time.monotonic() - started)
                    print(f"make test: session {name} ended (exit {proc.returncode}) "
                          f"after {ended[name][1]:.0f} s", flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached the sessions too: let them end their teardown
        for name, (proc, _) in sessions.items():
            ended.setdefault(name, (proc.wait(), time.monotonic() - started))
    wall = time.monotonic() - started
    lines = []
    for name, (_, log) in sessions.items():
        text = log.read_text(errors="replace")
        print(f"\n{'#' * 30} session {name}: {log.relative_to(ROOT)} {'#' * 30}\n{text}", flush=True)
        code, took = ended[name]
        lines.append(f"make test: session {name}: {summary_of(text)} (exit {code}, {took:.0f} s)")
    print("\n" + "\n".join(lines) + f"\nmake test: wall time {wall:.0f} s", flush=True)
    codes = [code for code, _ in ended.values()]
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
