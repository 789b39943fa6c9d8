"""Django settings, all from the environment with embedded defaults.

Defaults give a working single-machine platform: SQLite in the project folder and
the embedded Redis started by ``make run``. ``DATABASE_URL`` and ``REDIS_URL``
point everything at shared PostgreSQL / Redis when running on several machines.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import dj_database_url
from csp.constants import NONE, SELF

from dispatchsite.runtime import read_runtime, runtime_path, setting
from dispatchsite.secrets import load_secrets

BASE_DIR = Path(__file__).resolve().parent.parent
#: django-ninja's folder, found without importing it. Its templates and static files are named by path
#: (TEMPLATES, STATICFILES_DIRS): the API docs page then loads Swagger UI from this site, not a CDN with
#: an inline script (the CSP allows neither; ``api.views.SiteSwagger``). Not "ninja" in INSTALLED_APPS: an
#: app is imported at every process's start, and django-ninja with pydantic is 0.1 s of CPU that workers
#: and ``manage.py`` commands never use; only the web's URLconf imports it.
NINJA_DIR = Path(importlib.util.find_spec("ninja").origin).parent


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


SECRETS_FILE = Path(os.environ.get("DISPATCH_SECRETS_FILE", BASE_DIR / ".dispatch-secrets.json"))
GENERATED = load_secrets(SECRETS_FILE)

SECRET_KEY = os.environ.get("SECRET_KEY") or GENERATED["secret_key"]
DEBUG = env_bool("DEBUG")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "django_celery_beat",  # schedule definitions (interval, crontab, one-off) for tasks.Schedule
    "lanes",
    "tasks",
    "ops",
    "api",
]


def tools_installed(environ: Mapping[str, str] = os.environ) -> bool:
    """The measuring tools (load test, benchmark, ``loadtest.sink``) are in unless the production profile.

    ``DISPATCH_TOOLS=1`` / ``0`` forces them in or out either way.
    """
    forced = environ.get("DISPATCH_TOOLS", "").strip().lower()
    if forced:
        return forced in {"1", "true", "yes", "on"}
    return environ.get("DISPATCH_PROFILE") != "production"


#: Whether the ``tools`` app is installed (see tools_installed).
DISPATCH_TOOLS = tools_installed()
if DISPATCH_TOOLS:
    INSTALLED_APPS.append("tools")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "api.middleware.JsonErrorsMiddleware",  # every /api/ answer JSON, Django's own refusals included
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Content-Security-Policy on every response (django-csp 4 format): scripts and
# styles only from our own static files, so a tag that slipped into a page
# (a reflected XSS) cannot run. The admin and the dashboard keep no
# inline script or style; tests/browser fails on any reported violation.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}
#: ``X-Content-Type-Options: nosniff`` on every response (SecurityMiddleware; Django's default, kept explicit).
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

ROOT_URLCONF = "dispatchsite.urls"
WSGI_APPLICATION = "dispatchsite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'var' / 'dispatch.sqlite3'}",
        conn_max_age=600,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, workers and beat write concurrently: WAL and a generous busy timeout.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": DATABASES["default"]["NAME"]}
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [NINJA_DIR / "static"]  # Swagger UI's files (ninja/...), for the API docs page
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "admin:login"

# Production profile (``DISPATCH_PROFILE=production``): HTTPS-only cookies and HSTS.
if os.environ.get("DISPATCH_PROFILE") == "production":
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Where the running platform is ------------------------------------------
# The environment wins; else what a running `make run` recorded (dispatchsite.runtime); else the defaults.
RUNTIME_FILE = runtime_path(BASE_DIR)
RUNTIME = read_runtime(RUNTIME_FILE)
WEB_PORT = int(setting("WEB_PORT", "8000", RUNTIME))
FLOWER_PORT = int(setting("FLOWER_PORT", "5555", RUNTIME))
#: Where links for people (a dead letter's failure text) point to the admin.
DISPATCH_ADMIN_URL = os.environ.get("DISPATCH_ADMIN_URL") or f"http://127.0.0.1:{WEB_PORT}/admin/"

# --- Redis and Celery -------------------------------------------------------


def _broker_url(url: str, password: str) -> str:
    """A Sentinel URL for kombu, with ``REDIS_PASSWORD`` on its first part when it carries none."""
    first, sep, rest = url.strip().partition(";")
    if not password or "@" in first:
        return url
    return f"sentinel://:{quote(password, safe='')}@{first[len('sentinel://'):]}{sep}{rest}"


REDIS_PORT = int(setting("REDIS_PORT", "6380", RUNTIME))
#: The embedded Redis (``make run``): the platform's own ACL user, which has no admin or dangerous
#: commands (scripts/run.py's ``redis_conf``).
REDIS_USER = "dispatch"
REDIS_URL = setting("REDIS_URL", "", RUNTIME) or (
    f"redis://{REDIS_USER}:{quote(GENERATED['redis_password'], safe='')}@127.0.0.1:{REDIS_PORT}/0"
)

#: With ``REDIS_URL=sentinel://host:port;sentinel://host:port/0`` (Redis Sentinel), the
#: master's name as the Sentinels know it, the master's password when the URL
#: carries none, and the Sentinels' own password if they require one.
REDIS_SENTINEL = REDIS_URL.strip().lower().startswith("sentinel://")
DISPATCH_SENTINEL_MASTER = os.environ.get("DISPATCH_SENTINEL_MASTER", "mymaster")
REDIS_PASSWORD = os.environ.get("REDIS_PASSWORD", "")
DISPATCH_SENTINEL_PASSWORD = os.environ.get("DISPATCH_SENTINEL_PASSWORD", "")
#: Replicas that must hold an admission's write before ``dispatch`` answers
#: "accepted" (Redis ``WAIT``): 1 closes the loss window of a failover
#: (docs/scaling.md). 0 (default): answer as soon as the master wrote it.
DISPATCH_REPLICA_ACKS = int(os.environ.get("DISPATCH_REPLICA_ACKS", "0"))
#: Milliseconds admission waits for those replicas; past it ``dispatch`` answers
#: ``unavailable`` with "outcome unknown" (retry with the same idempotency key).
DISPATCH_REPLICA_ACKS_TIMEOUT_MS = int(os.environ.get("DISPATCH_REPLICA_ACKS_TIMEOUT_MS", "1000"))

#: Seconds a running task's claim, and the broker's visibility timeout, last
#: without renewal: a crashed worker's task is redelivered within about this.
DISPATCH_LEASE_S = float(os.environ.get("DISPATCH_LEASE_S", "30"))
#: Seconds after which the recovery sweep checks that a published, not yet
#: started task is still in the broker, and republishes it if not (a worker
#: killed between its pop and the claim loses the message: the broker keeps no
#: copy of a platform message a worker holds, lanes.transport). Was 600; a task
#: that merely waits longer in a backlog is found there and not copied.
DISPATCH_QUEUED_LEASE_S = float(os.environ.get("DISPATCH_QUEUED_LEASE_S", "60"))
#: Seconds any call to Redis by the platform (dispatch, workers' bookkeeping) may take
#: before it fails: dispatch then answers ``unavailable`` instead of hanging.
DISPATCH_REDIS_TIMEOUT_S = float(os.environ.get("DISPATCH_REDIS_TIMEOUT_S", "5"))
# Admission refuses new work (``redis_memory_high``) past this share of Redis' maxmemory (lanes/memory_guard.py),
# reading INFO memory at most every DISPATCH_MEMORY_CHECK_S seconds per process.
DISPATCH_MEMORY_HIGH = float(os.environ.get("DISPATCH_MEMORY_HIGH", "0.9"))
DISPATCH_MEMORY_CHECK_S = float(os.environ.get("DISPATCH_MEMORY_CHECK_S", "1"))
#: Deliveries of one attempt whose worker died before it finished: past this the
#: task is a dead letter with reason ``poison``.
DISPATCH_MAX_DELIVERIES = int(os.environ.get("DISPATCH_MAX_DELIVERIES", "3"))
#: Longest countdown / eta a dispatch may ask for, in seconds (default 7 days, the
#: longest timeout: a task must also start before its own deadline).
DISPATCH_MAX_DELAY_S = float(os.environ.get("DISPATCH_MAX_DELAY_S", str(7 * 86400)))
#: Seconds between checks that move due retries from the delayed set to the lane.
DISPATCH_PROMOTE_INTERVAL_S = float(os.environ.get("DISPATCH_PROMOTE_INTERVAL_S", "0.2"))
#: Seconds an idempotency key is remembered at dispatch by default.
DISPATCH_IDEMPOTENCY_WINDOW_S = int(os.environ.get("DISPATCH_IDEMPOTENCY_WINDOW_S", "86400"))
#: Days resolved dead letters are kept before the purge removes them.
DISPATCH_DEADLETTER_RETENTION_DAYS = int(os.environ.get("DISPATCH_DEADLETTER_RETENTION_DAYS", "30"))
#: Seconds a task's history and progress stay in Redis (tasks.history); 0: as long as its result row.
DISPATCH_HISTORY_TTL_S = int(os.environ.get("DISPATCH_HISTORY_TTL_S", "0"))
#: Where ``http.post`` may connect: ``host`` (default port only), ``host:port`` or ``host:*``
#: (tasks/webhook_url.py). Loopback on any port by default, for the local demo; nothing under
#: the production profile (loopback holds Redis, Flower and the admin): name each host and port.
DISPATCH_WEBHOOK_ALLOWED_HOSTS = env_list(
    "DISPATCH_WEBHOOK_ALLOWED_HOSTS",
    "" if os.environ.get("DISPATCH_PROFILE") == "production" else "127.0.0.1:*,localhost:*")
DISPATCH_METRICS_TOKEN = os.environ.get("DISPATCH_METRICS_TOKEN") or GENERATED["metrics_token"]
FLOWER_URL = os.environ.get("FLOWER_URL") or f"http://127.0.0.1:{FLOWER_PORT}/"
#: Modules imported at startup by every process (web, workers, commands) so the
#: lifecycle-signal receivers they connect run where the events happen.
DISPATCH_HOOK_MODULES = env_list("DISPATCH_HOOK_MODULES", "")
#: Your handler modules (like Celery's ``imports``), imported by every process at startup so
#: web (the admin's handler list), workers and commands know the same handlers; what a
#: running ``make run`` was given is the default of commands run beside it (dispatchsite.runtime).
DISPATCH_HANDLER_MODULES = [m.strip() for m in setting("DISPATCH_HANDLER_MODULES", "", RUNTIME).split(",")
                            if m.strip()]
#: A worker started with DISPATCH_CATCH_ALL=1 also consumes every lane that no
#: other live worker consumes, lanes created at run time included (lanes.worker).
DISPATCH_CATCH_ALL = env_bool("DISPATCH_CATCH_ALL")

#: On a thread-pool worker, run plain handlers' platform messages in groups (tasks.grouping):
#: claims, finishes and result rows once per group, without Celery's per-message request. Off:
#: every message takes Celery's request path (the same outcomes; a test compares the two).
DISPATCH_GROUPING = env_bool("DISPATCH_GROUPING", True)
#: A grouping worker's prefetch multiplier (messages it holds per thread; Celery's own default is 4).
DISPATCH_GROUP_PREFETCH = int(os.environ.get("DISPATCH_GROUP_PREFETCH", "4"))
#: A grouping worker's pop claims the plain messages its idle run threads will run (pop_more.lua: the
#: claim's round trip saved). Off: each is claimed by the run thread's own call (the same outcomes).
DISPATCH_CLAIM_AT_POP = env_bool("DISPATCH_CLAIM_AT_POP", True)
#: A worker consuming one lane writes its pop (pop_more.lua) behind its BRPOP on the lane's doorbell, in
#: one write: Redis runs it as the BRPOP returns (a round trip less a pop: what an idle lane's first
#: message waits for). Off: the pop is its own call once the BRPOP's reply is read (the same outcomes).
DISPATCH_POP_WITH_BRPOP = env_bool("DISPATCH_POP_WITH_BRPOP", True)
#: Threads a grouping worker may have stuck in handlers past their attempt limit before it takes no
#: more work and shuts down warm for a fresh one (0: the worker's concurrency).
DISPATCH_STUCK_THREADS_MAX = int(os.environ.get("DISPATCH_STUCK_THREADS_MAX", "0"))

CELERY_BROKER_URL = _broker_url(REDIS_URL, REDIS_PASSWORD) if REDIS_SENTINEL else REDIS_URL
# django-celery-results' table, written with one upsert per task (tasks.results).
CELERY_RESULT_BACKEND = "tasks.results.UpsertBackend"
# Celery's Django fixup otherwise closes every DB connection around every task,
# so each task paid a new connection (measured: benchmarks/archive.md, proposal 1).
CELERY_DB_REUSE_MAX = int(os.environ.get("CELERY_DB_REUSE_MAX", "1000"))
CELERY_RESULT_EXTENDED = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_EVENT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_SEND_TASK_EVENTS = env_bool("CELERY_WORKER_SEND_TASK_EVENTS", True)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "ingress"
CELERY_TASK_ROUTES = {"tasks.dispatch": {"queue": "ingress"}, "tasks.maintenance": {"queue": "ingress"}}
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # One Redis list per priority 0..9 (kombu: 0 is served first); see lanes.priorities.
    "queue_order_strategy": "priority",
    "priority_steps": list(range(10)),
    "sep": ":",
    "visibility_timeout": DISPATCH_LEASE_S,
    "unacked_restore_interval": max(1, int(DISPATCH_LEASE_S // 5)),
    "unacked_restore_throttle": 1,
    # The lock kombu takes around each scan for unacked messages (stock: 300 s).
    # A scan that meets a frozen Redis times out, but Redis runs its lock
    # request on resuming, so the lock stays held by no one until it expires:
    # a message whose ack was lost then stayed unacked, its chat blocked, for
    # minutes (fault scenario 4). A scan takes milliseconds, and each message
    # is handed back in a WATCH transaction, so a short lock is safe.
    "unacked_mutex_expire": 5,
    "max_connections": 128,
    # A broker call (ack, restore scan) answers or fails within this many seconds.
    "socket_timeout": float(os.environ.get("DISPATCH_BROKER_TIMEOUT_S", "15")),
    "socket_connect_timeout": 5,
}
if REDIS_SENTINEL:
    # kombu's Sentinel channel asks these Sentinels for the master (lanes.transport.SentinelTransport).
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = DISPATCH_SENTINEL_MASTER
    if DISPATCH_SENTINEL_PASSWORD:
        CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = {"password": DISPATCH_SENTINEL_PASSWORD}
CELERY_BROKER_POOL_LIMIT = 32
CELERY_WORKER_CONSUMER = "tasks.worker_consumer:Consumer"
CELERY_BROKER_TRANSPORT = "lanes.transport:SentinelTransport" if REDIS_SENTINEL else "lanes.transport:Transport"
# Upkeep (promote retries, expire waiting tasks, sweep leases) runs in a thread of
# every worker and of beat (tasks.maintenance), not as a beat task: a message every
# two seconds flooded Flower's task list and the log.
#: Beat is django-celery-beat's DatabaseScheduler, firing the admin's schedules through admission (tasks.beat).
CELERY_BEAT_SCHEDULER = "tasks.beat:Scheduler"
CELERY_BEAT_SCHEDULE = {
    "purge-dead-letters": {"task": "tasks.purge_dead_letters", "schedule": 3600.0},
    "purge-api-audit": {"task": "api.purge_audit", "schedule": 3600.0},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- HTTP API (api/) ----------------------------------------------------------
#: Requests per second a new service token may make (each token's own limit is in the admin).
DISPATCH_API_RATE_PER_S = int(os.environ.get("DISPATCH_API_RATE_PER_S", "100"))
#: Largest request body the API reads, in bytes (a bigger one is refused with 413).
DISPATCH_API_MAX_BODY_BYTES = int(os.environ.get("DISPATCH_API_MAX_BODY_BYTES", str(2 * 1024 * 1024)))
#: Days an API dispatch audit row is kept (purged hourly by beat, ``api.purge_audit``).
DISPATCH_API_AUDIT_RETENTION_DAYS = int(os.environ.get("DISPATCH_API_AUDIT_RETENTION_DAYS", "90"))
#: Serve the interactive API docs at /api/v1/docs (staff only).
DISPATCH_API_DOCS = env_bool("DISPATCH_API_DOCS", True)
