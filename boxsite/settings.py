"""The box's one settings module. Everything configurable is read from the environment.

Embedded default: SQLite (WAL, busy timeout, immediate transactions) under BOX_DATA_DIR, the
django-q2 ORM broker and polling live updates; no Redis needed.
Production: DATABASE_URL (PostgreSQL through psycopg 3) and REDIS_URL.
"""
from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from boxsite.core import hostnames
from boxsite.core.env import env_bool, env_float, env_int, env_list, env_path, env_str, env_url
from boxsite.core.keyfiles import read_or_create

BASE_DIR = Path(__file__).resolve().parent.parent
BOX_DATA_DIR = env_path("BOX_DATA_DIR", str(BASE_DIR / "var"))
if BOX_DATA_DIR.exists() and not BOX_DATA_DIR.is_dir():
    raise ImproperlyConfigured(f"BOX_DATA_DIR={BOX_DATA_DIR} is not a directory: move what is there away, "
                               "or point BOX_DATA_DIR at a directory")
BOX_DATA_DIR.mkdir(parents=True, exist_ok=True)
# What belongs to this machine alone when several machines share BOX_DATA_DIR (docs/internals/scaling.md):
# task views, sandbox runtime directories, id-mapped mounts, the pool of task users. By default
# the data directory itself (None: follow BOX_DATA_DIR).
BOX_LOCAL_DIR = env_path("BOX_LOCAL_DIR", "") if env_str("BOX_LOCAL_DIR") else None
if BOX_LOCAL_DIR is not None:
    BOX_LOCAL_DIR.mkdir(parents=True, exist_ok=True)
BOX_PRODUCTION = env_bool("BOX_PRODUCTION", False)

DEBUG = env_bool("BOX_DEBUG", False)


def _secret_key() -> str:
    """Django's signing key: from the environment, or generated once into the data dir."""
    configured = env_str("DJANGO_SECRET_KEY")
    if configured:
        return configured
    if BOX_PRODUCTION:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when BOX_PRODUCTION=1")
    # Processes starting together on a fresh data dir all end with the first one's key.
    generated = secrets.token_urlsafe(50).encode()
    return read_or_create(BOX_DATA_DIR / "django-secret-key", generated).decode().strip()


SECRET_KEY = _secret_key()
BOX_HOST = env_str("BOX_HOST", "127.0.0.1") or "127.0.0.1"
BOX_PORT = env_int("BOX_PORT", 8000, minimum=1)
# Where phones and links reach the box when that is not where it listens (a tunnel, a reverse
# proxy, a name on the network): the pairing QR code and links use it.
BOX_PUBLIC_URL = env_url("BOX_PUBLIC_URL")
# The Host headers the box answers: BOX_ALLOWED_HOSTS when set; else loopback, and when it
# listens beyond loopback also this machine's own names and addresses (a phone on the network
# opens it by them). BOX_PUBLIC_URL's host is always added.
_default_hosts = ["127.0.0.1", "localhost", "[::1]", "testserver"]
if hostnames.listens_wide(BOX_HOST):
    _default_hosts += ([] if BOX_HOST.strip("[]") in ("0.0.0.0", "::") else [hostnames.as_host(BOX_HOST.strip("[]"))])
    _default_hosts += hostnames.own_hosts()
ALLOWED_HOSTS = list(dict.fromkeys(env_list("BOX_ALLOWED_HOSTS", _default_hosts)))
CSRF_TRUSTED_ORIGINS = env_list("BOX_TRUSTED_ORIGINS", [])
if BOX_PUBLIC_URL:
    ALLOWED_HOSTS.append(urlsplit(BOX_PUBLIC_URL).hostname or "")
    CSRF_TRUSTED_ORIGINS.append(BOX_PUBLIC_URL)

# Not "daphne": the web process is daphne itself, and its app (for `runserver` only) would load
# Twisted into the memory of every worker and scheduler process too.
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # the API docs page's assets, served by the box (no CDN)
    "django_q",
    "channels",
    "boxsite",
    "tasks",
    "approvals",
    "schedules",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "boxsite.core.headers.ContentSecurityPolicyMiddleware",  # scripts only from the box's own files
    "boxsite.core.middleware.ApiEdgeMiddleware",  # NUL in path/query, declared body too large: refused first
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "boxsite.urls"
ASGI_APPLICATION = "boxsite.asgi.application"
WSGI_APPLICATION = "boxsite.wsgi.application"
# Threads the web process serves requests on (boxsite.core.handler); kept for the process's life.
BOX_WEB_THREADS = env_int("BOX_WEB_THREADS", 8, minimum=1)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "boxsite.context_processors.inbox_count",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------------------
if env_str("BOX_DB_POOL_SIZE") is not None:  # a setting that is gone is refused, never ignored
    raise ImproperlyConfigured("BOX_DB_POOL_SIZE is gone: each web thread keeps one database connection, so "
                               "BOX_WEB_THREADS bounds them; remove BOX_DB_POOL_SIZE")
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("BOX_DB_CONN_MAX_AGE", 60))
    if _db["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// URL (SQLite is the embedded default)")
    # A subprocess started by the tests (a real qcluster) is pointed at the test database.
    _name = env_str("BOX_DATABASE_NAME")
    if _name:
        _db["NAME"] = _name
    # Separate test databases for people (or agents) running suites side by side.
    _test_name = env_str("BOX_TEST_DATABASE_NAME")
    if _test_name:
        _db["TEST"] = {"NAME": _test_name}
    # A connection the database dropped (a restart, a terminated backend) is replaced before use.
    _db["CONN_HEALTH_CHECKS"] = True
    # Every commit waits for PostgreSQL to flush its log to disk unless the owner chooses
    # otherwise (docs/internals/decisions-performance.md#performance): without the flush, a crash of the server alone
    # may lose a run's claim while the worker that made it runs on.
    if not env_bool("BOX_DB_SYNCHRONOUS_COMMIT", True):
        # libpq's ``options`` replaces its PGOPTIONS variable, and DATABASE_URL may have set it
        # (``?currentSchema=``): both are kept, after, so they still win.
        _options = " ".join(part for part in ("-c synchronous_commit=off", _db.get("OPTIONS", {}).get("options"),
                                              env_str("PGOPTIONS")) if part)
        _db["OPTIONS"] = {**_db.get("OPTIONS", {}), "options": _options}
    # Every process keeps its connections (``BOX_DB_CONN_MAX_AGE``), checked before each request's
    # or job's first use: the worker and the scheduler have one, and the web process one per
    # thread it serves requests on (``BOX_WEB_THREADS``, kept for its life by boxsite.core.handler)
    # and one for the live streams' reads (Channels runs them on one thread).
    DATABASES = {"default": _db}
else:
    _sqlite_path = env_path("BOX_SQLITE_PATH", str(BOX_DATA_DIR / "box.sqlite3"))
    DATABASES = {
        "default": {
            # Django's SQLite backend whose writers queue on a file lock (boxsite/core/db/sqlite).
            "ENGINE": "boxsite.core.db.sqlite",
            "NAME": str(_sqlite_path),
            "OPTIONS": {
                "timeout": env_float("BOX_SQLITE_BUSY_TIMEOUT_S", 20.0),
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # Tests use a file (not :memory:) so a real qcluster subprocess can share it.
            "TEST": {"NAME": env_str("BOX_TEST_SQLITE_PATH") or str(BOX_DATA_DIR / "test.sqlite3")},
        }
    }
    # Every process keeps its threads' connections, as on PostgreSQL: the web process serves
    # requests on a few threads kept for its life (boxsite.core.handler), and a worker runs job after
    # job (django-q2 closes a connection past its age between jobs, and every connection before
    # it forks). A new connection costs CPU (the file opened, the pragmas, Django's functions
    # registered), and a worker that does not keep its connection pays it several times a task.
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("BOX_DB_CONN_MAX_AGE", 60)
DB_IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis, queue, live updates ---------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")

BOX_JOB_TIMEOUT_S = env_int("BOX_JOB_TIMEOUT_S", 3600, minimum=10)
BOX_JOB_RETRY_S = BOX_JOB_TIMEOUT_S + 300
Q_CLUSTER: dict[str, object] = {
    "name": env_str("BOX_QUEUE_NAME", "box"),
    "workers": env_int("BOX_WORKERS", 2, minimum=1),
    # A run heartbeats its lease; django-q2's own timeout only guards against a hung job.
    # retry must exceed timeout, or django-q2 hands a slow job to a second worker.
    "timeout": BOX_JOB_TIMEOUT_S,
    "retry": BOX_JOB_RETRY_S,
    # Recovery is the reaper's job (leases, backoff, a finite attempt count), so django-q2
    # delivers each job once and never re-queues a failed one on its own.
    "max_attempts": 1,
    "ack_failures": True,
    # The Run table is the record of every attempt; django-q2 keeps only failed jobs.
    "save_limit": -1,
    "catch_up": False,
    "poll": env_float("BOX_QUEUE_POLL_S", 0.2),
    # A worker process is replaced by a fresh fork after this many jobs (each a run), so what a
    # long-lived worker accumulates (caches, fragmented heap, a model client) is given back; its
    # janitor finishes the releases in hand first. 0: never.
    "recycle": env_int("BOX_WORKER_RECYCLE", 100, minimum=0),
    "label": "Queue",
}
# channels_redis waits for a consumer's next message in a blocking pop of 5 s, and redis-py cuts
# any read at its socket timeout, 5 s by default: a reply Redis sends a moment late (a loaded
# machine) would be cut, the pop sent again and, after redis-py's retries, the consumer would
# end, and with it the page's live stream. Reads get this long instead; the layer's connections
# keep a cancellation that Python 3.11's wait_for swallows, which with reads this long nothing
# else ends (docs/internals/decisions-isolation.md#portal-phone-and-live-streams).
LIVE_REDIS_READ_TIMEOUT_S = 30.0
LIVE_REDIS_CONNECT_TIMEOUT_S = 5.0


def live_layer(url: str, *, prefix: str = "asgi", **host: Any) -> dict[str, Any]:
    """The Redis channel layer's settings for ``url``; ``host``: more of redis-py's connection options."""
    return {
        "BACKEND": "boxsite.core.live_layer.LiveRedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": url, "socket_timeout": LIVE_REDIS_READ_TIMEOUT_S,
                       "socket_connect_timeout": LIVE_REDIS_CONNECT_TIMEOUT_S, **host}],
            "prefix": prefix,
        },
    }


if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
    CHANNEL_LAYERS = {"default": live_layer(REDIS_URL)}
else:
    Q_CLUSTER["orm"] = "default"
    # django-q2's ORM queue, whose pusher is woken by each enqueue instead of waiting out its poll.
    Q_CLUSTER["broker_class"] = "tasks.run.queue.WakingORM"
    CHANNEL_LAYERS = {}

# --- several machines (docs/internals/scaling.md) ---------------------------------------
# Unset (the default): one machine, one queue, and nothing below is read again. Set, this
# machine's worker cluster takes only the runs of the workspaces homed on it, from a queue of its
# own (``<BOX_QUEUE_NAME>.<BOX_MACHINE>``), and its web process serves the other machines' reads
# of those workspaces at BOX_MACHINE_URL, to callers that prove BOX_MACHINE_SECRET.
BOX_MACHINE = (env_str("BOX_MACHINE", "") or "").strip()
BOX_MACHINE_URL = env_url("BOX_MACHINE_URL")
BOX_MACHINE_SECRET = env_str("BOX_MACHINE_SECRET", "") or ""
# A machine whose worker cluster has not beaten for this long is gone: its workspaces move.
BOX_MACHINE_GONE_S = env_float("BOX_MACHINE_GONE_S", 120.0)
if BOX_MACHINE:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", BOX_MACHINE):
        raise ImproperlyConfigured(f"BOX_MACHINE={BOX_MACHINE!r}: use lowercase letters, digits and '-' (at most 31)")
    if not DB_IS_POSTGRES or not REDIS_URL:
        raise ImproperlyConfigured("BOX_MACHINE needs DATABASE_URL=postgres://... and REDIS_URL shared by every machine")
    if not BOX_MACHINE_URL:
        raise ImproperlyConfigured("BOX_MACHINE needs BOX_MACHINE_URL: where the other machines reach this one's web process")
    if len(BOX_MACHINE_SECRET) < 32:
        raise ImproperlyConfigured("BOX_MACHINE needs BOX_MACHINE_SECRET (at least 32 characters), the same on every machine")
    if not env_str("DJANGO_SECRET_KEY"):
        raise ImproperlyConfigured("BOX_MACHINE needs DJANGO_SECRET_KEY, the same on every machine (jobs are signed with it)")
    if not env_str("BOX_WEBPUSH_VAPID_KEY"):
        raise ImproperlyConfigured("BOX_MACHINE needs BOX_WEBPUSH_VAPID_KEY (a P-256 private key, PEM), the same on "
                                   "every machine: phones take pushes signed by the key they subscribed with")
    Q_CLUSTER["cluster_name"] = f"{Q_CLUSTER['name']}.{BOX_MACHINE}"
# Web Push's signing key: from the environment when set (several machines sign with one key),
# else generated into the data directory on first use. Literal "\n" stand for newlines (one line
# in an env file).
BOX_WEBPUSH_VAPID_KEY = (env_str("BOX_WEBPUSH_VAPID_KEY", "") or "").replace("\\n", "\n").strip()
if BOX_WEBPUSH_VAPID_KEY:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    try:
        _vapid = load_pem_private_key(BOX_WEBPUSH_VAPID_KEY.encode(), password=None)
    except ValueError as exc:
        raise ImproperlyConfigured(f"BOX_WEBPUSH_VAPID_KEY is not a PEM private key: {exc}") from exc
    if not isinstance(_vapid, ec.EllipticCurvePrivateKey) or _vapid.curve.name != "secp256r1":
        raise ImproperlyConfigured("BOX_WEBPUSH_VAPID_KEY must be a P-256 (prime256v1) key: "
                                   "openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt")
    del _vapid

# --- the box's own knobs ----------------------------------------------------------------
BOX_LEASE_SECONDS = env_int("BOX_LEASE_SECONDS", 30, minimum=2)
BOX_HEARTBEAT_SECONDS = env_float("BOX_HEARTBEAT_SECONDS", BOX_LEASE_SECONDS / 3)
BOX_MAX_RUN_ATTEMPTS = env_int("BOX_MAX_RUN_ATTEMPTS", 3, minimum=1)
BOX_RETRY_BACKOFF_SECONDS = env_float("BOX_RETRY_BACKOFF_SECONDS", 2.0)
BOX_SCHEDULER_TICK_SECONDS = env_float("BOX_SCHEDULER_TICK_SECONDS", 2.0)
# A queued run not claimed this long after it was sent, while a worker is free, is sent again.
BOX_RESEND_S = env_float("BOX_RESEND_S", 5.0)
# Sent runs waiting this long while a worker is free and nothing is claimed: the cluster leader
# restarts its cluster (runcluster's watchdog). Longer than BOX_RESEND_S, so a re-send gets its
# chance first.
BOX_STUCK_S = env_float("BOX_STUCK_S", 10.0)
# GET /metrics: the step and model-call latency histograms cover this many recent seconds.
BOX_METRICS_WINDOW_S = env_float("BOX_METRICS_WINDOW_S", 3600.0)
# The worker cluster and the scheduler each touch a heartbeat file under BOX_DATA_DIR/heartbeats
# every BOX_BEAT_S; /api/health calls one older than BOX_BEAT_STALE_S stale.
BOX_BEAT_S = env_float("BOX_BEAT_S", 5.0)
BOX_BEAT_STALE_S = env_float("BOX_BEAT_STALE_S", 30.0)
# How long a thread of a box process keeps the GIL while another waits for it, in ms (Python's
# default is 5). A worker's run and its janitor's release, or a request and the publisher, take
# turns: a statement's reply waits up to this long before its thread runs again (docs/internals/decisions.md).
BOX_GIL_SWITCH_MS = env_float("BOX_GIL_SWITCH_MS", 1.0)
if not 0 < BOX_GIL_SWITCH_MS <= 1000:
    raise ImproperlyConfigured(f"BOX_GIL_SWITCH_MS must be above 0 and at most 1000, not {BOX_GIL_SWITCH_MS}")
# Tests only: the instants of a step's ending where a worker (or the sandbox's init) holds, once
# per task, so a recovery test can kill it exactly there (tasks.run.receipts.hold).
BOX_TEST_HOLD = frozenset(env_list("BOX_TEST_HOLD", []))
# How long a stopping box waits for its processes before it kills them.
BOX_STOP_GRACE_S = env_float("BOX_STOP_GRACE_S", 15.0)
# Schedules: a failed firing retries after base * 2^(n-1) seconds, never longer than the max.
BOX_SCHEDULE_BACKOFF_SECONDS = env_float("BOX_SCHEDULE_BACKOFF_SECONDS", 30.0)
BOX_SCHEDULE_BACKOFF_MAX_SECONDS = env_float("BOX_SCHEDULE_BACKOFF_MAX_SECONDS", 3600.0)
BOX_WEBHOOK_MAX_BYTES = env_int("BOX_WEBHOOK_MAX_BYTES", 256 * 1024, minimum=1024)
# The largest API request body (a task spec with its flow); larger is 413 before it is read.
BOX_API_MAX_BYTES = env_int("BOX_API_MAX_BYTES", 1024 * 1024, minimum=1024)
# The largest file PUT into a workspace (PUT /api/workspaces/<name>/files/<path>), in MB; larger is 413.
BOX_UPLOAD_MAX_MB = env_int("BOX_UPLOAD_MAX_MB", 64, minimum=1)
BOX_LIVE_POLL_SECONDS = env_float("BOX_LIVE_POLL_SECONDS", 0.1)
BOX_PRESETS_FILE = env_str("BOX_PRESETS_FILE")
BOX_TOOLS_FILE = env_str("BOX_TOOLS_FILE")
BOX_LAYER_DRIVER = env_str("BOX_LAYER_DRIVER", "auto")
# Lower layers a task mounts (besides the base) before the oldest are compacted into flat layers.
BOX_LAYER_MAX_DEPTH = env_int("BOX_LAYER_MAX_DEPTH", 16, minimum=2)
# auto: sandbox every task when the box runs as root (tasks.sandbox); off: never (says so).
BOX_SANDBOX = env_str("BOX_SANDBOX", "auto")
if BOX_SANDBOX not in ("auto", "off"):
    raise ImproperlyConfigured(f"BOX_SANDBOX must be auto or off, not {BOX_SANDBOX!r}")
# Free task users kept ready in the pool (tasks.sandbox.users): made ahead, so no account tool runs
# on a task's path; 0 makes a user at each task's start and deletes it at its release.
BOX_USER_POOL = env_int("BOX_USER_POOL", 4, minimum=0)
# Each sandboxed task's defaults (a task's `limits` may set its own): memory in MB (no swap), and
# a CPU cap in percent of one core. Enforced with cgroups; /api/health says when they cannot be.
BOX_TASK_MEMORY_MB = env_int("BOX_TASK_MEMORY_MB", 2048, minimum=16)
BOX_TASK_CPU_PERCENT = env_int("BOX_TASK_CPU_PERCENT", 100, minimum=1)
# What a sandboxed task may write to its layer, in MB (tasks.layers.disk: an image per task);
# 0: no default (only a task that sets limits.disk_mb is bounded).
BOX_TASK_DISK_MB = env_int("BOX_TASK_DISK_MB", 10240, minimum=0)
if 0 < BOX_TASK_DISK_MB < 16:
    raise ImproperlyConfigured(f"BOX_TASK_DISK_MB={BOX_TASK_DISK_MB}: use 0 (no default) or at least 16")
# The model (tasks.llm.client): an OpenAI-compatible chat-completions endpoint. Settings → Model
# overrides each of these; the API key is the vault secret named BOX_MODEL_KEY_NAME (empty: the
# endpoint takes no key, as local servers often do). Prices are cents per million tokens.
BOX_MODEL_BASE_URL = env_str("BOX_MODEL_BASE_URL") or ""
BOX_MODEL_NAME = env_str("BOX_MODEL_NAME") or ""
BOX_MODEL_KEY_NAME = env_str("BOX_MODEL_KEY_NAME", "MODEL_API_KEY") or ""
BOX_MODEL_INPUT_CENTS_PER_MILLION = env_float("BOX_MODEL_INPUT_CENTS_PER_MILLION", 0.0)
BOX_MODEL_OUTPUT_CENTS_PER_MILLION = env_float("BOX_MODEL_OUTPUT_CENTS_PER_MILLION", 0.0)
# A cached input token's price (prompt caching); unset: the input price.
BOX_MODEL_CACHED_INPUT_CENTS_PER_MILLION = (env_float("BOX_MODEL_CACHED_INPUT_CENTS_PER_MILLION", 0.0)
                                            if env_str("BOX_MODEL_CACHED_INPUT_CENTS_PER_MILLION") else None)
# The longest silence between two chunks of a streamed answer (not a bound on the whole answer:
# a local model on a CPU may write for minutes).
BOX_MODEL_IDLE_TIMEOUT_S = env_float("BOX_MODEL_IDLE_TIMEOUT_S", 120.0)
# The output cap sent with each call (reasoning models spend part of it thinking); also the
# budget's look-ahead.
BOX_MODEL_MAX_OUTPUT_TOKENS = env_int("BOX_MODEL_MAX_OUTPUT_TOKENS", 8192, minimum=16)
# Sent as reasoning_effort when set: low, medium or high.
BOX_MODEL_REASONING_EFFORT = env_str("BOX_MODEL_REASONING_EFFORT") or ""
if BOX_MODEL_REASONING_EFFORT not in ("", "low", "medium", "high"):
    raise ImproperlyConfigured(f"BOX_MODEL_REASONING_EFFORT={BOX_MODEL_REASONING_EFFORT!r}: use low, medium or high")
# A model call meeting a 429, a 5xx, a timeout or a dropped connection is tried again: at most
# this many tries, none starting later than RETRY_MAX_S after the first, waiting RETRY_BASE_S
# doubled each time (with jitter) or what the endpoint's Retry-After says.
BOX_MODEL_RETRY_TRIES = env_int("BOX_MODEL_RETRY_TRIES", 5, minimum=1)
BOX_MODEL_RETRY_MAX_S = env_float("BOX_MODEL_RETRY_MAX_S", 120.0)
BOX_MODEL_RETRY_BASE_S = env_float("BOX_MODEL_RETRY_BASE_S", 1.0)
# The model's context window: near it the agent compacts older turns into a summary.
BOX_MODEL_CONTEXT_TOKENS = env_int("BOX_MODEL_CONTEXT_TOKENS", 32768, minimum=2048)
# How long one of the agent's commands may run unless the model gives its own timeout.
BOX_AGENT_COMMAND_TIMEOUT_S = env_float("BOX_AGENT_COMMAND_TIMEOUT_S", 300.0)
# The Chromium a task's browser steps run (Debian's package; its binary is started directly).
BOX_BROWSER_EXECUTABLE = env_str("BOX_BROWSER_EXECUTABLE", "/usr/bin/chromium") or "/usr/bin/chromium"
# How long what the model found for a ``describe`` target is replayed before it asks again; 0
# turns the grounding cache off (tasks.browser.cache).
BOX_GROUNDING_CACHE_DAYS = env_float("BOX_GROUNDING_CACHE_DAYS", 30.0)
if BOX_GROUNDING_CACHE_DAYS < 0:
    raise ImproperlyConfigured(f"BOX_GROUNDING_CACHE_DAYS={BOX_GROUNDING_CACHE_DAYS}: 0 or more days")
# How long a browser kept across a pause may sit unused (no run, no input from the live view)
# before it is closed; 0 keeps it until the task ends.
BOX_BROWSER_IDLE_SECONDS = env_float("BOX_BROWSER_IDLE_SECONDS", 900.0)

# --- API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "boxsite.core.auth.BearerTokenAuthentication",
        "boxsite.core.auth.DeviceCookieAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "boxsite.core.errors.exception_handler",
    # JSON only, bounded in size and depth, no NUL characters (boxsite.core.parsers).
    "DEFAULT_PARSER_CLASSES": ["boxsite.core.parsers.BoxJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "The box API",
    "DESCRIPTION": "Run AI-agent tasks on your own machine, safely.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # JSON Schema 2020-12 inside (nullable is a type), so a client can validate bodies with it.
    "OAS_VERSION": "3.1.0",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "boxsite.core.schema.add_shapes_and_errors"],
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_COOKIES = env_bool("BOX_SECURE_COOKIES", BOX_PRODUCTION)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
LOGIN_URL = "/login"
# Failed sign-ins (boxsite.core.signin): this many from one address for one name locks that pair for
# BOX_SIGNIN_LOCKOUT_SECONDS; an address is locked at 4x (any names), a name at 10x (any address).
BOX_SIGNIN_MAX_FAILURES = env_int("BOX_SIGNIN_MAX_FAILURES", 5, minimum=1)
BOX_SIGNIN_LOCKOUT_SECONDS = env_int("BOX_SIGNIN_LOCKOUT_SECONDS", 900, minimum=1)
# Behind a TLS-terminating proxy (daphne speaks plain HTTP; deploy/Caddyfile) the box trusts the
# proxy's X-Forwarded-Proto to know a request came over HTTPS, and the address it appended last to
# X-Forwarded-For as the client's (boxsite.core.signin). Only a box whose port nothing but the
# proxy reaches may trust them: anyone else could claim any address. On in production, which
# also tells browsers to use HTTPS only; BOX_HSTS_SECONDS=0 turns HSTS off explicitly (while
# moving a box to its final name).
BOX_TRUSTED_PROXY = env_bool("BOX_TRUSTED_PROXY", BOX_PRODUCTION)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BOX_TRUSTED_PROXY else None
SECURE_HSTS_SECONDS = env_int("BOX_HSTS_SECONDS", 31536000 if BOX_PRODUCTION else 0, minimum=0)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BOX_DATA_DIR / "static"

# plain: one readable line a record; json: one JSON object a line (boxsite.core.logformat)
BOX_LOG_FORMAT = env_str("BOX_LOG_FORMAT", "plain")
if BOX_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"BOX_LOG_FORMAT must be plain or json, not {BOX_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
                   "json": {"()": "boxsite.core.logformat.JsonLines"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": BOX_LOG_FORMAT}},
    "filters": {"allowed_hosts_hint": {"()": "boxsite.core.hostnames.AllowedHostsHint"}},
    "root": {"handlers": ["console"], "level": env_str("BOX_LOG_LEVEL", "INFO")},
    # django-q2's own logger ("django-q") stays at INFO: its cluster's start and its jobs are in
    # the worker's log, which start-up checks and the owner read.
    "loggers": {"daphne": {"level": "WARNING"},
                "django.security.DisallowedHost": {"filters": ["allowed_hosts_hint"]}},
}
