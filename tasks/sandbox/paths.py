"""Where a task's sandbox keeps its runtime files, and which of the box's own files it may see.

Each task gets ``runtime_dir(task_id)`` = ``BOX_DATA_DIR/run/<task_id>/``: the broker socket
(``broker.sock``, created by ``tasks.broker``), the egress proxy's socket (``egress.sock``) and
the mount point of the task's view (``view``). When the sandbox is on, the directory is root's with the task's
group allowed to traverse it (0710): only that task (and root) can reach the sockets in it, and
each socket belongs to the task's user (0600). A socket created here must be chowned to the
task's user (``tasks.sandbox.users.find_user``).

The ``box`` client lives under ``BOX_BIN_DIR`` (``/usr/local/lib/box/bin/<digest>/box``, one
directory per client version: ``tasks.broker.paths.client_dir``), outside the data directory and
readable by every task user; that directory comes first on a sandboxed ``PATH``.
It runs with the system ``/usr/bin/python3`` and finds its socket in ``BOX_BROKER_SOCKET``.
"""
from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from boxsite.core.setting_paths import path_setting

BOX_BIN_DIR = Path("/usr/local/lib/box/bin")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # after the client's directory

# Files in the data directory a task must never read, whatever their path: the database (and its
# WAL, shared-memory and writer-gate files), the vault key, Django's signing key.
_PRIVATE_SUFFIXES = (".sqlite3", ".sqlite3-wal", ".sqlite3-shm", ".sqlite3-journal", ".sqlite3-gate")
_PRIVATE_NAMES = ("vault.key", "django-secret-key")


def data_dir() -> Path:
    return path_setting("BOX_DATA_DIR")


def local_dir() -> Path:
    """This machine's part of the data directory (``BOX_LOCAL_DIR``; by default the same)."""
    return path_setting("BOX_LOCAL_DIR") if settings.BOX_LOCAL_DIR else data_dir()


def runtime_root() -> Path:
    return local_dir() / "run"


def runtime_dir(task_id: str) -> Path:
    """The task's runtime directory (sockets, the view's mount point). Not created here."""
    if not task_id or "/" in task_id or task_id.startswith("."):
        raise ValueError(f"not a task id: {task_id!r}")
    return runtime_root() / task_id


def broker_socket(task_id: str) -> Path:
    return runtime_dir(task_id) / "broker.sock"


def egress_socket(task_id: str) -> Path:
    return runtime_dir(task_id) / "egress.sock"


def kept_browser(task_id: str) -> Path:
    """The record of the task's browser kept across a pause (``tasks.browser.session``)."""
    return runtime_dir(task_id) / "browser.json"


def view_mount(task_id: str) -> Path:
    """Where the task's view appears inside its sandbox (mounted in its own mount namespace)."""
    return runtime_dir(task_id) / "view"


def ensure_runtime_dir(task_id: str, uid: int | None = None, gid: int | None = None) -> Path:
    """Create the task's runtime directory; with ``uid``, open it to the task's user (0710)."""
    root = runtime_root()
    if not os.path.isdir(root):  # looked at first: a mkdir of one that exists locks its parent
        root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # traversable, not listable: a task cannot see other tasks' ids
    path = runtime_dir(task_id)
    path.mkdir(mode=0o700, exist_ok=True)
    (path / "view").mkdir(mode=0o700, exist_ok=True)
    if uid is not None:
        # root's, with the task's group allowed to traverse only: the task reaches the sockets
        # in it (each owned by its user, 0600) but cannot create files beside its view.
        os.chown(path, 0, gid if gid is not None else uid)
        os.chmod(path, 0o710)
    return path


def private_home(task_id: str) -> Path:
    """Where an external agent's HOME is: in the task's runtime directory, outside its copy of
    the workspace, so the dotfiles a CLI writes never land in the task's diff."""
    return runtime_dir(task_id) / "home"


def ensure_private_home(task_id: str, uid: int | None = None, gid: int | None = None) -> Path:
    """Create ``private_home`` (0700); with ``uid``, the task's user's own."""
    home = private_home(task_id)
    if not home.parent.is_dir():
        ensure_runtime_dir(task_id)
    home.mkdir(mode=0o700, exist_ok=True)
    if uid is not None:
        os.chown(home, uid, gid if gid is not None else uid)
    return home


def harden_data_dir() -> None:
    """Make the box's data directory unreadable to task users.

    The directory itself stays traversable (0711) so a task can reach its own runtime directory
    by path; everything else in it is either a directory only root may enter or a private file
    only root may read. Cheap (a handful of chmods), so it runs before every sandboxed start.
    """
    for root in {data_dir(), local_dir()}:
        os.chmod(root, 0o711)
        for entry in os.scandir(root):
            if entry.is_symlink():
                continue
            if entry.is_dir():
                # run/ must be traversable (and the local dir, when it is inside the data dir);
                # every other directory (tasks/, workspaces/, static/...) is the box's own.
                traversable = entry.name == "run" or Path(entry.path) == local_dir()
                os.chmod(entry.path, 0o711 if traversable else 0o700)
            elif entry.name in _PRIVATE_NAMES or entry.name.endswith(_PRIVATE_SUFFIXES):
                os.chmod(entry.path, 0o600)
    for name in _database_files():
        if name.exists():
            os.chmod(name, 0o600)


def _database_files() -> list[Path]:
    """The SQLite database and its side files, wherever BOX_SQLITE_PATH put them."""
    db = settings.DATABASES["default"]
    if settings.DB_IS_POSTGRES:
        return []
    main = Path(str(db["NAME"]))
    return [main, Path(f"{main}-wal"), Path(f"{main}-shm"), Path(f"{main}-journal"), Path(f"{main}-gate")]
