"""Reaching a path inside a folder without following a link on the way, and opening only
regular files.

Keep writes into the owner's real folders as root, and the files API, the diff and the copy
driver read what a task left behind. A task controls those trees: it can plant a symlink where a
directory was (``sub -> /etc``) or a FIFO where a file was. So every walk here starts at a
directory descriptor and opens one component at a time with ``O_NOFOLLOW``: a symlinked (or
non-directory) parent is reported as ``LinkInPath``, never resolved. A file is opened with
``O_NONBLOCK`` and checked with ``fstat`` before a byte is read: a FIFO, socket or device is
``NotRegular``, never read or written.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.layers.tree import special_type

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LinkInPath(OSError):
    """A component on the way to a path is a symlink or not a directory."""


class NotRegular(OSError):
    """The path is a special file (or a link, where a file was expected): it is never opened."""


def _parts(rel: str) -> list[str]:
    return [p for p in rel.split("/") if p not in ("", ".")]


@contextmanager
def directory(root: Path, rel: str = "", *, create: bool = False) -> Iterator[int]:
    """A descriptor of directory ``rel`` under ``root``, reached without following links.
    ``create`` makes missing directories (mode 0755). Raises ``LinkInPath``, or
    ``FileNotFoundError`` when a component is missing and ``create`` is off."""
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LinkInPath(exc.errno, f"'{root}' is not a directory (a link?)") from exc
        raise
    try:
        walked = ""
        for part in _parts(rel):
            if part == "..":
                raise LinkInPath(errno.EINVAL, f"'{rel}' climbs out with '..'")
            walked = f"{walked}/{part}" if walked else part
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkInPath(exc.errno, f"'{walked}' is a link or a file, not a directory") from exc
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def split(rel: str) -> tuple[str, str]:
    parent, _, name = rel.rpartition("/")
    return parent, name


def lstat_at(root: Path, rel: str) -> os.stat_result | None:
    """``lstat`` of ``rel`` under ``root`` (None: missing). ``LinkInPath`` on a linked parent."""
    parent, name = split(rel)
    if not name:
        return os.lstat(root)
    try:
        with directory(root, parent) as fd:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_regular(path: Path | str, *, dir_fd: int | None = None) -> int:
    """A read descriptor of a regular file, opened without following a link or blocking on a
    FIFO. ``NotRegular`` for anything else."""
    try:
        fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(exc.errno, f"'{path}' is a link") from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(errno.EINVAL, f"'{path}' is a {special_type(st)}")
    os.set_blocking(fd, True)
    return fd


def digest_fd(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, 1 << 16):
        digest.update(chunk)
    return digest.hexdigest()


def fingerprint(root: Path, rel: str) -> str | None:
    """What ``rel`` holds, comparable across trees: a file's SHA-256 and permission bits, a
    link's target, a special file's type (never opened). None: missing."""
    parent, name = split(rel)
    try:
        with directory(root, parent) as fd:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            return _fingerprint_in(fd, name, st)
    except FileNotFoundError:
        return None


def fingerprint_path(path: Path) -> str:
    """The same for a path the box owns (a layer's file): the file itself is not followed."""
    st = os.lstat(path)
    with directory(path.parent) as fd:
        return _fingerprint_in(fd, path.name, st)


def _fingerprint_in(fd: int, name: str, st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(name, dir_fd=fd)
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if not stat.S_ISREG(st.st_mode):
        return f"special:{special_type(st)}"
    file_fd = open_regular(name, dir_fd=fd)
    try:
        return f"file:{stat.S_IMODE(st.st_mode):o}:{digest_fd(file_fd)}"
    finally:
        os.close(file_fd)


def remove_at(root: Path, rel: str) -> None:
    """Remove ``rel`` (a whole directory tree, links not followed). Missing is fine."""
    parent, name = split(rel)
    try:
        with directory(root, parent) as fd:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)  # the fd-based rmtree: never leaves the tree
            else:
                os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return


def remove_empty_tree_at(root: Path, rel: str) -> bool:
    """Remove directory ``rel`` if it holds nothing but (empty) directories. True: it is gone."""
    parent, name = split(rel)
    try:
        with directory(root, parent) as fd:
            return _remove_empty(fd, name)
    except FileNotFoundError:
        return True


def _remove_empty(fd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    child = os.open(name, DIR_FLAGS, dir_fd=fd)
    try:
        names = os.listdir(child)
        if not all(_remove_empty(child, n) for n in names):
            return False
    finally:
        os.close(child)
    os.rmdir(name, dir_fd=fd)
    return True


def make_dir_at(root: Path, rel: str, like: os.stat_result | None = None) -> None:
    """Directory ``rel`` exists (parents made as needed); a new one takes ``like``'s mode."""
    parent, name = split(rel)
    with directory(root, parent, create=True) as fd:
        try:
            os.mkdir(name, stat.S_IMODE(like.st_mode) if like else 0o755, dir_fd=fd)
        except FileExistsError:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise LinkInPath(errno.ENOTDIR, f"'{rel}' is not a directory") from None
            return
        if like is not None:
            os.chmod(name, stat.S_IMODE(like.st_mode), dir_fd=fd, follow_symlinks=False)


def replace_at(root: Path, rel: str, source: Path, tmp_tag: str) -> None:
    """Put ``source`` (a regular file or a link the box owns) at ``rel`` atomically: written
    beside the target, fsynced, renamed over it. The target's parent is reached without links;
    a directory in the way is removed (it was the task's deletion)."""
    src_st = os.lstat(source)
    parent, name = split(rel)
    with directory(root, parent, create=True) as fd:
        tmp = f".{name}.box-{tmp_tag}.tmp"
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass
        try:
            owner = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            owner = os.fstat(fd)
        if stat.S_ISLNK(src_st.st_mode):
            os.symlink(os.readlink(source), tmp, dir_fd=fd)
        elif stat.S_ISREG(src_st.st_mode):
            _write_copy(source, fd, tmp, src_st)
        else:
            raise NotRegular(errno.EINVAL, f"'{rel}' is a {special_type(src_st)}: special files are never kept")
        if os.geteuid() == 0:
            os.chown(tmp, owner.st_uid, owner.st_gid, dir_fd=fd, follow_symlinks=False)
        os.utime(tmp, ns=(src_st.st_atime_ns, src_st.st_mtime_ns), dir_fd=fd, follow_symlinks=False)
        current = os.stat(name, dir_fd=fd, follow_symlinks=False) if _exists(fd, name) else None
        if current is not None and stat.S_ISDIR(current.st_mode):
            shutil.rmtree(name, dir_fd=fd)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        os.fsync(fd)


def _exists(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _write_copy(source: Path, dir_fd: int, tmp: str, src_st: os.stat_result) -> None:
    src = open_regular(source)
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(src_st.st_mode), dir_fd=dir_fd)
        try:
            while chunk := os.read(src, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fchmod(out, stat.S_IMODE(src_st.st_mode))
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(src)
