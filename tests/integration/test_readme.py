"""Issue 13: the README, followed line by line, does what it says.

Starts the platform the README's way (the real ``scripts/run.py``, from a copy
of the project in a temporary folder, on free ports), then runs every command
block the README marks with ``<!-- readme-test: NAME -->`` in that folder, as a
reader would paste it, and compares what it prints with the block marked
``<!-- readme-test: NAME output -->`` that follows it. The comparison is loose
where the README is: ``…`` and ``<placeholders>`` stand for anything, numbers
for any number, runs of white space for any white space. A marked command that
exits non-zero, or prints something else, fails the test. The banner
``make run`` printed must be the README's, with only the secrets and ports
differing. Stopped by Ctrl-C (SIGINT to its process group), then by PID.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.make_run import Started, copy_project, http_status, make_run, plain_env
from tests.support.redis_server import free_port
from tests.support.workers import ROOT

pytestmark = [pytest.mark.slow]

START_TIMEOUT_S = 120
BLOCK_TIMEOUT_S = 60
#: Marked blocks the README must keep: the newcomer's path through it.
REQUIRED = {"banner", "first-dispatch", "lanes", "deadletters", "http-api", "config-file", "send-task",
            "client-install", "python-dispatch", "send-later"}
#: Python blocks the README says to paste into ``manage.py shell`` (code with the project's settings).
SHELL_BLOCKS = {"python-dispatch"}
#: Blocks with no output to compare: the banner is compared with run.py's own, the Celery snippet's outcome
#: is read through the API, the client's install is proven by running the snippet in what it installed.
NO_OUTPUT = {"banner", "send-task", "client-install"}
#: Virtual environments made with only the README's client install, by its hash (git-ignored, kept across runs).
BARE_VENVS = ROOT / ".venv-bare"
#: What pip says when it cannot reach a package index (the bare-venv test is skipped then, not failed).
NO_INDEX = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
            "Network is unreachable", "Could not fetch URL")

_MARKED = re.compile(r"<!-- readme-test: (?P<name>[\w-]+)(?P<output> output)? -->\s*\n"
                     r"```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S)
_PLACEHOLDER = re.compile(r"…|\.\.\.|<[^>\n]+>")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class Block:
    name: str
    lang: str
    command: str = ""
    expected: str | None = None


def readme_blocks(text: str) -> dict[str, Block]:
    """The README's marked blocks by name: each command, and the output shown after it (if any)."""
    blocks: dict[str, Block] = {}
    for found in _MARKED.finditer(text):
        name, body = found["name"], found["body"]
        block = blocks.setdefault(name, Block(name, found["lang"]))
        if found["output"]:
            assert block.expected is None, f"README: two output blocks marked {name!r}"
            block.expected = body
        else:
            assert not block.command, f"README: two command blocks marked {name!r}"
            block.command, block.lang = body, found["lang"]
    return blocks


def loose_pattern(expected: str) -> re.Pattern:
    """A regex for what the README shows: placeholders match anything, numbers any number, spaces any spaces."""
    parts = []
    for i, piece in enumerate(_PLACEHOLDER.split(expected)):
        if i:
            parts.append(r".*?")
        for j, literal in enumerate(_NUMBER.split(piece)):
            if j:
                parts.append(r"-?\d+(?:\.\d+)?")
            parts.append(r"\s*".join(re.escape(word) for word in re.split(r"\s+", literal)))
    return re.compile("".join(parts), re.S)


def test_loose_pattern_is_loose_only_where_the_readme_is():
    pattern = loose_pattern('{"accepted": true, "task_id": "…", "queue": "default", …}')
    assert pattern.search('{"accepted": true, "task_id": "ab-12", "queue": "default", "priority": 5}')
    assert not pattern.search('{"accepted": false, "task_id": "ab-12", "queue": "default"}')
    assert not pattern.search('{"accepted": true, "task_id": "ab-12", "queue": "bulk"}')
    assert loose_pattern('"position": 0,\n  "x": <id>').search('"position":   12, "x": 9f')


# --- the platform, started the README's way -------------------------------------------------------

@dataclass
class Platform:
    root: Path
    web: int
    flower: int
    redis: int
    env: dict[str, str]
    log: Path
    started: Started

    def substitute(self, text: str) -> str:
        """The README's default ports and the Redis password placeholder, as this run has them."""
        secrets = json.loads((self.root / ".dispatch-secrets.json").read_text())
        return (text.replace("127.0.0.1:8000", f"127.0.0.1:{self.web}")
                .replace("127.0.0.1:5555", f"127.0.0.1:{self.flower}")
                .replace("127.0.0.1:6380", f"127.0.0.1:{self.redis}")
                .replace("REDIS_PASSWORD", secrets["redis_password"])
                .replace("/tmp/dispatch.json", str(self.root / "dispatch.json")))  # not a file others share

    def run(self, command: str, lang: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        command = self.substitute(command)
        python = str(self.root / ".venv" / "bin" / "python")
        argv = ([python, "-c", command] if lang == "python"
                else [python, "manage.py", "shell", "-c", command] if lang == "shell"
                else ["bash", "-e", "-c", command])
        return subprocess.run(argv, cwd=cwd or self.root, env=self.env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("readme") / "project", venv=True)  # the README says .venv/bin/python
    web, flower, redis_port = free_port(), free_port(), free_port()
    env = plain_env({"DISPATCH_LEASE_S", "DISPATCH_QUEUED_LEASE_S", "CELERY_WORKER_SEND_TASK_EVENTS", "ALLOWED_HOSTS"})
    # The README's default worker groups, one instance each and fewer threads: the machine is shared.
    run_env = {**env, "WEB_PORT": str(web), "FLOWER_PORT": str(flower), "REDIS_PORT": str(redis_port),
               "WORKER_REALTIME_INSTANCES": "1", "WORKER_CONCURRENCY": "2", "REDIS_APPENDFSYNC": "everysec"}
    with make_run(root, run_env, lambda: http_status(f"http://127.0.0.1:{web}/admin/login/") == 200,
                  timeout_s=START_TIMEOUT_S) as run:
        # Commands run in the project folder with a plain environment: they find the ports in var/runtime.json.
        yield Platform(root, web, flower, redis_port, env, run.log_path, run)


@pytest.fixture(scope="module")
def blocks() -> dict[str, Block]:
    return readme_blocks((ROOT / "README.md").read_text())


def test_the_readme_marks_the_newcomers_commands(blocks):
    assert REQUIRED <= set(blocks), f"README lost its readme-test markers: {sorted(REQUIRED - set(blocks))}"
    for block in blocks.values():
        assert block.expected is not None or block.name in NO_OUTPUT, f"{block.name}: no output"


def _check(platform: Platform, block: Block, cwd: Path | None = None, python: Path | None = None) -> str:
    if python is not None:  # a Python block run by another interpreter (the bare client's)
        done = subprocess.run([str(python), "-c", platform.substitute(block.command)], cwd=cwd, env=platform.env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    else:
        done = platform.run(block.command, "shell" if block.name in SHELL_BLOCKS else block.lang, cwd)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"README block {block.name!r} exited {done.returncode}:\n{output[-3000:]}"
    if block.expected is not None:
        expected = platform.substitute(block.expected)
        assert loose_pattern(expected).search(done.stdout), (
            f"README block {block.name!r} printed something else than the README shows.\n"
            f"--- README:\n{expected}\n--- printed:\n{done.stdout[-3000:]}")
    return done.stdout


def test_make_run_prints_the_readmes_banner(platform, blocks):
    secrets = json.loads((platform.root / ".dispatch-secrets.json").read_text())
    printed = platform.log.read_text(errors="replace")
    assert not [name for name, value in secrets.items() if value in printed], "make run printed a credential"
    expected = platform.substitute(blocks["banner"].command)
    assert expected in printed, f"--- README:\n{expected}\n--- make run printed:\n{printed[-2000:]}"


@pytest.mark.parametrize("name", ["first-dispatch", "python-dispatch", "send-later", "lanes", "deadletters",
                                  "http-api", "config-file"])
def test_readme_block_does_what_it_says(platform, blocks, name):
    _check(platform, blocks[name])


def bare_client_python(install: str) -> Path:
    """A virtual environment holding only what the README's client install puts there (made once, then kept)."""
    venv = BARE_VENVS / hashlib.sha256(install.encode()).hexdigest()[:16]
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", "-e", "-c", install], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        if any(sign in done.stderr for sign in NO_INDEX):
            pytest.skip(f"pip cannot reach a package index for the README's client install: {done.stderr[-500:]}")
        pytest.fail(f"the README's client install failed:\n{install}\n{done.stderr[-3000:]}")
    (venv / ".installed").write_text(install)
    return python


def test_bare_celery_snippet_is_admitted_and_followed_through_the_api(platform, blocks, tmp_path):
    """Run in a virtual environment with only what the README installs, then follow the message's id."""
    python = bare_client_python(blocks["client-install"].command)
    message_id = _check(platform, blocks["send-task"], cwd=tmp_path, python=python).strip().splitlines()[-1]
    token = platform.run(".venv/bin/python manage.py api_token create readme-follow --type demo.echo "
                         "--reads-broker-tasks", "sh").stdout.strip()

    def state(task_id: str) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{platform.web}/api/v1/tasks/{task_id}",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    deadline = time.monotonic() + 30
    while (answer := state(message_id))["state"] != "SUCCESS" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert answer["state"] == "SUCCESS" and answer["task_name"] == "tasks.dispatch", answer
    assert answer["result"]["accepted"] is True and answer["dispatched_task_id"] == answer["result"]["task_id"]
    while (task := state(answer["dispatched_task_id"]))["state"] != "SUCCESS" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert task["state"] == "SUCCESS" and task["result"] == {"hello": 1}, task


def test_ctrl_c_stops_everything_quietly(platform):
    """Last in this file: Ctrl-C (SIGINT to make run's process group) stops web, beat, Flower, workers, then Redis.

    Redis stopped first (it shared the terminal's process group) made every
    worker log connection tracebacks on the way out.
    """
    proc = platform.started.proc
    before = platform.log.stat().st_size
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=90) == 0
    stopping = platform.log.read_bytes()[before:].decode(errors="replace")
    assert "Traceback" not in stopping and "heartbeat_clear_failed" not in stopping, stopping[-4000:]
    assert "ERROR/" not in stopping and "CRITICAL/" not in stopping, stopping[-4000:]
    order = [stopping.find(f"{name} stopped") for name in ("web", "worker-default")]
    assert -1 not in order and order[0] < order[1], stopping[-4000:]
