"""The production defaults an outside review found too open, each against the real part.

The embedded Redis as ``make run`` configures it (its ACL user, maxmemory), a
Redis out of memory under admission, Flower as ``make run`` starts it, and the
production profile's defaults.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique, wait_until
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_script_hardening", ROOT / "scripts" / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)


def _status(url: str, auth: tuple[str, str] | None = None) -> int | None:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


# --- the embedded Redis: the platform's user has no admin or dangerous command; maxmemory, noeviction ----

def test_the_platforms_redis_user_cannot_reconfigure_or_wipe_redis(tmp_path):
    from dispatchsite.redis_server import server_path

    port, password, admin = free_port(), "pw-" + unique("x"), "admin-" + unique("x")
    conf = tmp_path / "redis.conf"
    conf.write_text(run.redis_conf(port, password, tmp_path, admin))
    proc = subprocess.Popen([server_path(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        platform = redis.Redis(port=port, username="dispatch", password=password, socket_timeout=5)
        wait_until(lambda: _pings(platform), timeout=20, what="the embedded redis")
        for command in (("CONFIG", "SET", "maxmemory", "0"), ("CONFIG", "GET", "requirepass"), ("FLUSHALL",),
                        ("FLUSHDB",), ("DEBUG", "SLEEP", "0"), ("MODULE", "LIST"), ("KEYS", "*"), ("ACL", "LIST"),
                        ("SHUTDOWN", "NOSAVE"), ("CLIENT", "LIST")):
            with pytest.raises(redis.ResponseError) as refused:  # NOPERM (DEBUG: also off in the server itself)
                platform.execute_command(*command)
            assert "permission" in str(refused.value) or "not allowed" in str(refused.value), (command, refused)
        # What the platform does: scripts that write, lists, pub/sub, INFO (the status page).
        assert platform.eval("redis.call('SET', KEYS[1], ARGV[1]) return redis.call('GET', KEYS[1])", 1,
                             "k", "v") == b"v"
        assert platform.rpush("q", "m") == 1 and platform.publish("ch", "x") == 0
        assert "role" in platform.info("replication")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password=password, socket_timeout=5).ping()  # default user: not its password
        operator = redis.Redis(port=port, password=admin, socket_timeout=5)
        assert int(operator.config_get("maxmemory")["maxmemory"]) > 0
        assert operator.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert operator.config_get("bind")["bind"] == "127.0.0.1"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


# --- a Redis out of memory: admission answers unavailable, nothing half-written -----------------------------

def test_admission_answers_redis_out_of_memory_and_writes_nothing(rc, monkeypatch):
    from lanes import keys, memory_guard
    from tasks import config
    from tasks.dispatch import admit, dispatch_many

    # Redis itself refusing (another client filled it, or the guard's reading is a second old): the
    # guard, which refuses first as redis_memory_high (test_memory_guard.py), is out of the way here.
    monkeypatch.setattr(memory_guard, "refusal", lambda items=1, now=None: None)

    name = unique("oom")
    define(name, handler="demo.echo", lane="t-oom", chat_scoped=True)
    client = ApiClient(make_token(unique("svc"), [name]))
    config.current()  # the config cached before Redis is full (reading it needs no memory anyway)
    chat = unique("chat")
    keys_before = rc.dbsize()
    rc.config_set("maxmemory-policy", "noeviction")
    rc.config_set("maxmemory", "1")
    try:
        one = admit(name, {"n": 1}, chat_id=chat, idempotency_key=unique("k"))
        many = dispatch_many(name, [({"n": i}, {"chat_id": f"{chat}-{i % 3}"}) for i in range(20)])
        over_http = client.post("/dispatch", {"task_type": name, "payload": {"n": 1}, "chat_id": chat})
        keys_during = rc.dbsize()
    finally:
        rc.config_set("maxmemory", "0")
    for result in (one, *many):
        assert (result.accepted, result.reason) == (False, "unavailable")
        assert result.detail.startswith("Redis is out of memory") and "nothing was written" in result.detail
    assert over_http.status_code == 503 and json.loads(over_http.content)["detail"].startswith("Redis is out")
    assert keys_during <= keys_before  # no record, chat queue, key or message of any of them
    assert not rc.exists(keys.chat_queue(chat), keys.chat_queue(f"{chat}-0"))
    assert admit(name, {"n": 1}, chat_id=chat).accepted  # and it takes work again once there is room


# --- Flower as make run starts it: /metrics and /healthcheck need its credentials -------------------------

def test_flowers_metrics_and_healthcheck_need_its_credentials(monkeypatch, tmp_path):
    import honcho.manager

    commands: dict[str, tuple[str, dict]] = {}

    class Recorder:
        returncode = 0

        def add_process(self, name, cmd, **kwargs):
            commands[name] = (cmd, kwargs.get("env") or {})

        def loop(self):
            return None

    monkeypatch.setattr(honcho.manager, "Manager", Recorder)
    port = free_port()
    run.run_services({"flower_password": "flower-pw-27"}, web_port=free_port(), flower_port=port)
    cmd, env = commands["flower"]
    assert "flower-pw-27" not in cmd
    log = open(tmp_path / "flower.log", "wb")
    flower = subprocess.Popen(cmd.split(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, **env})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _status(base + "/") is not None, timeout=60, interval=0.2, what="flower up")
        for path in ("/metrics", "/healthcheck", "/", "/api/workers"):
            assert _status(base + path) == 401, path
            assert _status(base + path, ("admin", "wrong")) == 401, path
        assert _status(base + "/metrics", ("admin", "flower-pw-27")) == 200
        assert _status(base + "/healthcheck", ("admin", "flower-pw-27")) == 200
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(timeout=20)
        log.close()


# --- the production profile ----------------------------------------------------------------------------

def test_the_production_profile_has_no_demo_types_and_an_empty_webhook_allow_list(tmp_path):
    from django.core.management.base import OutputWrapper
    from django.test import override_settings

    from tasks.config_io import default_config_for
    from tasks.management.commands import bootstrap

    data = json.loads(bootstrap.DEFAULT_CONFIG.read_text())
    assert any(t["name"].startswith("demo.") for t in default_config_for(data, "")["task_types"])
    assert not any(t["name"].startswith("demo.") or t["handler"].startswith("demo.")
                   for t in default_config_for(data, "production")["task_types"])
    env = {k: v for k, v in os.environ.items() if k != "DISPATCH_WEBHOOK_ALLOWED_HOSTS"}
    env.update(DISPATCH_PROFILE="production", DISPATCH_SECRETS_FILE=str(tmp_path / "secrets.json"))
    out = subprocess.run([sys.executable, "-c", "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
                          "'dispatchsite.settings'); django.setup(); from django.conf import settings; "
                          "print(settings.DISPATCH_WEBHOOK_ALLOWED_HOSTS)"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
    command = bootstrap.Command()
    command.stdout = OutputWrapper(open(os.devnull, "w"))
    with override_settings(DISPATCH_WEBHOOK_ALLOWED_HOSTS=[]):
        webhook = next(t for t in data["task_types"] if t["handler"] == "http.post")
        assert command._allowed(webhook) is False  # left out, said so: the bootstrap itself goes on
