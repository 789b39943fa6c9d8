"""Scenario 9: the security baseline, as a test.

- ``manage.py check --deploy`` is clean in the production settings profile;
- the embedded Redis that ``make run`` starts refuses connections without its
  password and listens on loopback only;
- Flower, as ``make run`` starts it, refuses requests without its credentials;
- the dashboard, its lane controls, ``/metrics``, Flower's auth check and the
  dead-letter actions refuse anonymous users and users without the permission;
- only JSON is accepted on the wire; the secrets file is private.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tests.support.helpers import define, unique, wait_until
from tests.support.redis_server import free_port
from tests.support.workers import CELERY, ROOT
from tools.loadcheck import Report


def _run_services_commands(monkeypatch, envs: dict | None = None) -> dict[str, str]:
    """The exact commands (and, into ``envs``, environments) ``make run`` hands to honcho, without starting them."""
    import honcho.manager

    sys.path.insert(0, str(ROOT / "scripts"))
    import run

    commands: dict[str, str] = {}

    class Recorder:
        returncode = 0

        def add_process(self, name, cmd, **kwargs):
            commands[name] = cmd
            if envs is not None:
                envs[name] = kwargs.get("env") or {}

        def loop(self):
            return None

    monkeypatch.setattr(honcho.manager, "Manager", Recorder)
    secrets = {"admin_password": "a", "flower_password": "flower-pw-123", "metrics_token": "m"}
    run.run_services(secrets, web_port=free_port(), flower_port=free_port())
    return commands


def test_09_security_baseline(tmp_path, monkeypatch, record):
    started = time.time()
    checks: dict[str, bool] = {}
    probes: dict[str, tuple[int, int]] = {}  # door -> (requests made, refused as they should be)

    # 1. Django's deployment checks, production profile, warnings included.
    env = {**os.environ, "DISPATCH_PROFILE": "production", "DEBUG": "0"}
    out = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    checks["check --deploy (production) clean"] = True

    # 2. The embedded Redis, configured exactly as `make run` configures it.
    sys.path.insert(0, str(ROOT / "scripts"))
    import run

    from dispatchsite.redis_server import server_path

    port, password, admin_password = free_port(), "pw-" + unique("x"), "admin-" + unique("x")
    conf = tmp_path / "redis.conf"
    conf.write_text(run.redis_conf(port, password, tmp_path, admin_password))
    proc = subprocess.Popen([server_path(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        good = redis.Redis(port=port, password=admin_password, socket_timeout=5)
        wait_until(lambda: _pings(good), timeout=20, what="embedded redis up")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, socket_timeout=5).get("x")  # no password: NOAUTH
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="wrong", socket_timeout=5).ping()
        assert good.config_get("bind")["bind"] == "127.0.0.1"
        assert good.config_get("protected-mode")["protected-mode"] == "yes"
        assert good.config_get("appendonly")["appendonly"] == "yes"
        addresses = _non_loopback_addresses()
        for address in addresses:
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass
        probes["redis"] = (2 + len(addresses), 2 + len(addresses))
        checks[f"embedded Redis: password required, not reachable on {addresses or 'any non-loopback address'}"] = True
    finally:
        proc.terminate()
        proc.wait(timeout=20)

    # 3. Flower, started with the command `make run` uses: basic auth, loopback.
    envs: dict[str, dict] = {}
    commands = _run_services_commands(monkeypatch, envs)
    flower_cmd = commands["flower"]
    # The credentials reach Flower through its environment: a command line is world-readable (ps).
    assert "flower-pw-123" not in flower_cmd and "--address=127.0.0.1" in flower_cmd
    assert envs["flower"]["FLOWER_BASIC_AUTH"] == "admin:flower-pw-123"
    assert all("127.0.0.1" in cmd for name, cmd in commands.items() if name == "web")
    flower_port = free_port()
    log = open(tmp_path / "flower.log", "wb")
    flower = subprocess.Popen([CELERY, "-A", "dispatchsite", "flower", "--address=127.0.0.1", f"--port={flower_port}"],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "FLOWER_BASIC_AUTH": envs["flower"]["FLOWER_BASIC_AUTH"]})
    try:
        url = f"http://127.0.0.1:{flower_port}/"
        wait_until(lambda: _http_status(url) is not None, timeout=60, interval=0.2, what="flower up")
        assert _http_status(url) == 401
        assert _http_status(url, ("admin", "wrong")) == 401
        assert _http_status(url + "api/workers") == 401
        assert _http_status(url, ("admin", "flower-pw-123")) == 200
        probes["flower"] = (4, 3)
        checks["Flower: basic auth required"] = True
    finally:
        os.killpg(flower.pid, 15)
        flower.wait(timeout=20)

    # 4. The web pages: anonymous, logged-in non-staff, staff without permissions, permitted.
    lane, name = unique("sec-lane"), unique("sec-type")
    define(name, lane=lane)
    from tasks.models import DeadLetter

    row = DeadLetter.objects.create(task_id=unique("sec-dl"), task_type=name, lane=lane, reason="exhausted",
                                    payload={"a": 1})
    users = {
        "anonymous": None,
        "user": get_user_model().objects.create_user(unique("user"), password="pw-123456"),
        "staff": get_user_model().objects.create_user(unique("staff"), password="pw-123456", is_staff=True),
    }
    users["staff"].user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    token = settings.DISPATCH_METRICS_TOKEN
    expect = [
        # (who, method, path, extra, allowed statuses)
        ("anonymous", "get", "/admin/dashboard/", {}, {302}),
        ("anonymous", "get", "/admin/dashboard/data/", {}, {302}),
        ("anonymous", "post", f"/admin/dashboard/lanes/{lane}/close/", {}, {302}),
        ("anonymous", "get", "/admin/tasks/deadletter/", {}, {302}),
        ("anonymous", "post", "/admin/tasks/deadletter/", {"action": "discard", "_selected_action": [row.pk]}, {302}),
        ("anonymous", "get", "/metrics", {}, {401}),
        ("anonymous", "get", "/metrics", {"HTTP_AUTHORIZATION": "Bearer wrong"}, {401}),
        ("anonymous", "get", "/admin/flower-auth/", {}, {401}),
        ("user", "get", "/admin/dashboard/", {}, {302}),
        ("user", "get", "/metrics", {}, {401}),
        ("user", "get", "/admin/flower-auth/", {}, {401}),
        ("user", "post", f"/admin/dashboard/lanes/{lane}/close/", {}, {302}),
        ("staff", "post", f"/admin/dashboard/lanes/{lane}/close/", {}, {403}),
        ("staff", "post", "/admin/tasks/deadletter/", {"action": "discard", "_selected_action": [row.pk]}, {200, 302}),
        ("staff", "post", "/admin/tasks/deadletter/", {"action": "requeue", "_selected_action": [row.pk]}, {200, 302}),
        ("anonymous", "get", "/metrics", {"HTTP_AUTHORIZATION": f"Bearer {token}"}, {200}),
    ]
    for who, method, path, extra, allowed in expect:
        client = Client()
        if users[who] is not None:
            client.force_login(users[who])
        data = {k: v for k, v in extra.items() if not k.startswith("HTTP_")}
        headers = {k: v for k, v in extra.items() if k.startswith("HTTP_")}
        response = getattr(client, method)(path, data, **headers)
        assert response.status_code in allowed, (who, method, path, response.status_code)
        if response.status_code == 302:
            assert response["Location"].startswith("/admin/login/"), (who, path, response["Location"])
    from lanes.models import Lane

    row.refresh_from_db()
    assert row.status == "dead" and not row.requeued_task_id  # neither discarded nor requeued
    assert Lane.objects.get(name=lane).accepting  # not closed
    probes["web"] = (len(expect), len(expect) - 1)  # all but the right bearer token are refused
    checks["web: dashboard, lane controls, /metrics, dead-letter actions refuse"] = True

    # 5. JSON only on the wire; secrets private.
    assert settings.CELERY_ACCEPT_CONTENT == ["json"] and settings.CELERY_TASK_SERIALIZER == "json"
    assert settings.CELERY_RESULT_SERIALIZER == "json" and settings.CELERY_EVENT_SERIALIZER == "json"
    assert stat.S_IMODE(os.stat(settings.SECRETS_FILE).st_mode) == 0o600
    checks["JSON only; secrets file 0600"] = True

    rep = Report(scenario="9 security baseline", offered=sum(n for n, _ in probes.values()),
                 rejected=sum(r for _, r in probes.values()))
    rep.extra["checks"] = sorted(checks)
    rep.extra["probes (made, refused)"] = probes
    record("09-security", rep, started)


def _pings(client: redis.Redis) -> bool:
    try:
        return client.ping()
    except redis.ConnectionError:
        return False


def _non_loopback_addresses() -> list[str]:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True)
    return [a for a in out.stdout.split() if "." in a and not a.startswith("127.")]


def _http_status(url: str, auth: tuple[str, str] | None = None) -> int | None:
    request = urllib.request.Request(url)
    if auth:
        import base64

        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None
