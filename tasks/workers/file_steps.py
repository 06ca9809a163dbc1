"""The flow's file steps, ``write`` and ``delete``: only inside the task's files, only regular
files written, and what a step creates owned as the task's view's root is."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed


def write_step(ctx: RunContext, value: Any) -> tuple[Any, Evidence]:
    """A ``write`` step: the file's content (JSON for anything but text), its parents made."""
    target = inside(ctx.workdir, value["path"])
    content = value["content"] if isinstance(value["content"], str) else json.dumps(value["content"])
    created = make_parents(ctx.workdir, target)
    if target.is_symlink():
        target.unlink()
    new_file = not os.path.lexists(target)
    if new_file:
        created.append(target)
    write_regular(target, content)
    give_to_task_user(ctx.workdir, created)
    return value["path"], Evidence({"path": value["path"], "bytes": target.stat().st_size, "created": new_file})


def delete_step(ctx: RunContext, value: Any) -> tuple[Any, Evidence]:
    """A ``delete`` step: a file, a link or a whole directory; failed when nothing is there."""
    relative = value if isinstance(value, str) else value["path"]
    target = inside(ctx.workdir, relative)
    if target.is_dir() and not target.is_symlink():
        size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(target)
        return relative, Evidence({"path": relative, "bytes": size, "directory": True})
    if target.exists() or target.is_symlink():
        size = target.lstat().st_size
        target.unlink()
        return relative, Evidence({"path": relative, "bytes": size, "directory": False})
    raise StepFailed(f"'{relative}' does not exist", evidence=Evidence({"path": relative}))


def inside(workdir: Path, relative: str) -> Path:
    """The path under ``workdir``; refuses anything that would land outside it."""
    if not relative or relative.startswith("/"):
        raise StepFailed(f"'{relative}' is not a relative path inside the task's files")
    target = (workdir / relative)
    resolved_parent = target.parent.resolve()
    root = workdir.resolve()
    if resolved_parent != root and root not in resolved_parent.parents:
        raise StepFailed(f"'{relative}' is outside the task's files")
    if target.is_symlink():
        link = target.resolve()
        if link != root and root not in link.parents:
            raise StepFailed(f"'{relative}' is a link to outside the task's files")
    return target


def make_parents(workdir: Path, target: Path) -> list[Path]:
    """Create the missing directories above ``target``; return them, outermost first."""
    missing: list[Path] = []
    parent = target.parent
    while parent != workdir and not parent.exists():
        missing.append(parent)
        parent = parent.parent
    missing.reverse()
    for directory in missing:
        directory.mkdir()
    return missing


def give_to_task_user(workdir: Path, created: list[Path]) -> None:
    """What a step created belongs to whoever owns the root of the task's view: the task's user
    on the overlay driver (its upper layer is the user's), root on disk where the view is shown
    to the sandbox id-mapped (the copy driver). Otherwise a later ``run`` step, which runs as
    the task's user, could not write into a directory a ``write`` step made."""
    if os.geteuid() != 0 or not created:
        return
    owner = os.stat(workdir)
    for path in created:
        os.lchown(path, owner.st_uid, owner.st_gid)


def write_regular(target: Path, content: str) -> None:
    """Write a regular file; a FIFO, socket or device at ``target`` is refused, never opened
    (opening a FIFO for writing would wait for a reader and pin the worker)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise StepFailed(f"'{target.name}' is not a regular file; a write step only writes regular files")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(target, flags, 0o666)
    with os.fdopen(fd, "wb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in since the check above
            raise StepFailed(f"'{target.name}' is not a regular file; a write step only writes regular files")
        handle.truncate(0)
        handle.write(content.encode())
