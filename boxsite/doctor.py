"""``manage.py doctor``: what this machine gives the box, each check with the fix when it fails.

A required check failing means the box cannot work as set up (no database, a data directory it
cannot write); an optional one means a feature is missing or weaker (no browser steps, no
memory limits). The command exits 0 only when every required check passes."""
from __future__ import annotations

import errno
import os
import pwd
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.db import connection

from boxsite.core import sql
from tasks.browser import binary
from tasks.llm.client import NoModel, current_config
from tasks.sandbox import cgroups, support
from tasks.sandbox import syscall_filter as filter_binding
from tasks.sandbox.isolation import layer_driver

NAMESPACES = ("pid", "net", "mnt", "ipc", "uts")
MIN_FREE_MB = 512
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def run_checks() -> list[Check]:
    return [check() for check in (sandbox, namespaces, syscall_filter, cgroup_limits, overlay, database,
                                  queue_redis, data_dir, disk_space, chromium, model_endpoint)]


def sandbox() -> Check:
    found = support.standing()
    if found.sandboxed:
        return Check("sandbox", True, "tasks run sandboxed (root: a user and namespaces per task)")
    if found.mode == "off":
        lacks = f" (the sandbox would lack: {'; '.join(found.missing)})" if found.missing else ""
        return Check("sandbox", True, f"off, as set (BOX_SANDBOX=off): tasks run as the box's own user{lacks}")
    return Check("sandbox", False, f"tasks are refused: the box cannot sandbox them ({found.reason})", support.FIX)


def namespaces() -> Check:
    missing = [name for name in NAMESPACES if not os.path.exists(f"/proc/self/ns/{name}")]
    if missing:
        return Check("namespaces", False, f"this kernel lacks {', '.join(missing)} namespaces",
                     "use a Linux kernel with namespaces (a container may hide them: run it privileged)",
                     required=False)
    return Check("namespaces", True, f"{', '.join(NAMESPACES)} available", required=False)


def syscall_filter() -> Check:
    problem = filter_binding.unavailable()
    if problem is None:
        return Check("syscall filter", True, f"{filter_binding.LIBRARY} loads (the box's own binding)", required=False)
    return Check("syscall filter", False, f"{problem}: the sandbox cannot start tasks without the filter",
                 "apt install libseccomp2 (or your distribution's libseccomp)", required=False)


def cgroup_limits() -> Check:
    reason = cgroups.unavailable()
    if reason is None:
        return Check("cgroups", True, f"memory and CPU limits with {cgroups.describe()}", required=False)
    return Check("cgroups", False, f"memory and CPU limits are not enforced: {reason}",
                 "run the box as root on a cgroup v2 system (or delegate the memory and cpu controllers to it)",
                 required=False)


def overlay() -> Check:
    driver = layer_driver()
    if driver == "overlay":
        return Check("overlayfs", True, "task layers are overlay mounts", required=False)
    return Check("overlayfs", False, f"task layers use the {driver} driver (a full copy of the workspace per task)",
                 "run the box as root on a kernel with overlayfs (modprobe overlay)", required=False)


def database() -> Check:
    vendor = "PostgreSQL" if settings.DB_IS_POSTGRES else "SQLite"
    try:
        sql.ping()
    except Exception as exc:  # noqa: BLE001 - any failure is the finding, reported with its fix
        connection.close()
        return Check("database", False, f"{vendor} does not answer: {exc}".strip(),
                     "check DATABASE_URL (PostgreSQL running, reachable, the role allowed) or, for SQLite, "
                     "that BOX_SQLITE_PATH's directory is writable by the box's user")
    return Check("database", True, f"{vendor} answers")


def queue_redis() -> Check:
    if not settings.REDIS_URL:
        return Check("redis", True, "not used (REDIS_URL unset: the queue and live updates go through the database)")
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=CONNECT_TIMEOUT_S,
                             socket_timeout=CONNECT_TIMEOUT_S).ping()
    except redis.RedisError as exc:
        return Check("redis", False, f"REDIS_URL does not answer: {exc}",
                     "start Redis (systemctl start redis-server) or unset REDIS_URL")
    return Check("redis", True, "answers")


def data_dir() -> Check:
    path = Path(settings.BOX_DATA_DIR)
    if not path.is_dir():
        return Check("data dir", False, f"{path} is not a directory",
                     f"move what is at {path} away, or point BOX_DATA_DIR at a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        fix = (f"remount {path}'s file system read-write, or point BOX_DATA_DIR at a writable directory"
               if exc.errno == errno.EROFS else f"give the box's user write access: chown -R {_user()} {path}")
        return Check("data dir", False, f"{path} is not writable: {exc.strerror}", fix)
    return Check("data dir", True, f"{path} is writable")


def disk_space() -> Check:
    path = Path(settings.BOX_DATA_DIR)
    try:
        free_mb = shutil.disk_usage(path).free // (1024 * 1024)
    except OSError as exc:
        return Check("disk space", False, f"cannot read the free space of {path}: {exc.strerror}",
                     "point BOX_DATA_DIR at an existing directory")
    if free_mb < MIN_FREE_MB:
        return Check("disk space", False, f"{free_mb} MB free under {path}",
                     f"free space there (at least {MIN_FREE_MB} MB), or move BOX_DATA_DIR to a larger disk")
    return Check("disk space", True, f"{free_mb} MB free under {path}")


def chromium() -> Check:
    reason = binary.missing_reason()
    if reason is None:
        return Check("chromium", True, f"{binary.executable()} (browser steps)", required=False)
    return Check("chromium", False, f"browser steps cannot run: {reason}",
                 "apt install chromium, or set BOX_BROWSER_EXECUTABLE", required=False)


def model_endpoint() -> Check:
    try:
        config = current_config()
    except NoModel:
        return Check("model", True, "none configured (agent tasks need one: Settings → Model)", required=False)
    except Exception as exc:  # noqa: BLE001 - the settings row unreadable: the database check says why
        return Check("model", False, f"cannot read the model's settings: {exc}", "fix the database first",
                     required=False)
    parts = urlsplit(config.base_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return Check("model", False, f"{config.base_url} is not reachable: {exc}",
                     "start the model server, or correct the base URL in Settings → Model (Test connection)",
                     required=False)
    return Check("model", True, f"{config.base_url} reachable ({config.model})", required=False)


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
