"""The task's root, built by its init (``init.py``) before the task's command runs, and the fresh
scratch directories each command of a run's long-lived init gets.

Loaded by ``init.py`` by path, as root, before the host's tree is gone (the isolated interpreter
has no package to import it from); its functions are used after the pivot too. Like ``init.py`` it
runs under the system ``/usr/bin/python3 -I -S`` with only the standard library: it must not
import the box.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000
_SYS_PIVOT_ROOT, _MNT_DETACH = 155, 0x2
_NEW_ROOT = "/tmp"  # a fresh tmpfs is mounted here (in this mount namespace only) and becomes /
# The task's system image: the host's programs and libraries, read-only.
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC_FILES = ("hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "localtime", "timezone", "os-release",
              "debian_version", "mime.types", "protocols", "services", "shells", "profile", "bash.bashrc",
              "inputrc", "environment", "gai.conf", "host.conf", "resolv.conf", "locale.alias", "magic", "mailcap")
_ETC_DIRS = ("ld.so.conf.d", "alternatives", "ssl", "ca-certificates", "python3", "python3.11", "profile.d", "fonts")
_SYS_MOVE_MOUNT, _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 429, 0x4, -100
def fail(message: str) -> None:
    sys.stderr.write(f"box sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(126)


def check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        fail(f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _bind(source: str, target: str, *, writable: bool = False, flags: int = _MS_NOSUID | _MS_NODEV) -> None:
    """Bind ``source`` (not its submounts) at ``target``, read-only unless ``writable``."""
    mount(source, target, None, _MS_BIND)
    if not writable:
        mount("none", target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)


def _copy_entry(source: str, target: str) -> None:
    """Copy a small system file (or a symlink, as a symlink) into the new root."""
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
    else:
        with open(source, "rb") as handle:
            content = handle.read()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, content)
        os.close(fd)


def _write(target: str, content: str) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, content.encode())
    os.close(fd)


def _system_etc(root: str, config: dict[str, Any]) -> None:
    """The new root's /etc: a few of the host's files and its own passwd and group."""
    etc = root + "/etc"
    os.mkdir(etc, 0o755)
    for name in _ETC_FILES:
        if os.path.lexists("/etc/" + name) and (os.path.islink("/etc/" + name) or os.path.isfile("/etc/" + name)):
            _copy_entry("/etc/" + name, f"{etc}/{name}")
    for name in _ETC_DIRS:
        if os.path.isdir("/etc/" + name) and not os.path.islink("/etc/" + name):
            os.mkdir(f"{etc}/{name}", 0o755)
            _bind("/etc/" + name, f"{etc}/{name}")
    user, uid, gid, home = config["user"], config["uid"], config["gid"], config["view"]
    _write(etc + "/passwd", f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
                            f"{user}:x:{uid}:{gid}:box task:{home}:/usr/sbin/nologin\n"
                            f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    _write(etc + "/group", f"root:x:0:\n{user}:x:{gid}:\nnogroup:x:65534:\n")
    _write(etc + "/hostname", "box\n")


def _system_dev(root: str) -> None:
    dev = root + "/dev"
    os.mkdir(dev, 0o755)
    mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        _write(f"{dev}/{name}", "")
        mount("/dev/" + name, f"{dev}/{name}", None, _MS_BIND)
    os.mkdir(dev + "/pts", 0o755)
    mount("devpts", dev + "/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    os.symlink("pts/ptmx", dev + "/ptmx")
    os.mkdir(dev + "/shm", 0o1777)
    mount("tmpfs", dev + "/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m")
    for index, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{index}", f"{dev}/{name}")
    os.symlink("/proc/self/fd", dev + "/fd")
    mount("none", dev, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")


def build_root(config: dict[str, Any]) -> None:
    """Make the task's root: a read-only system image (/usr and its links, a minimal /etc, /dev),
    its view and runtime directory at their usual paths, private /tmp, /var/tmp and /run, its own
    /proc and /sys; then pivot into it and drop the host's tree (and with it the mount table).
    """
    runtime, view = config["runtime"], config["view"]
    keep = os.open(runtime, os.O_PATH | os.O_DIRECTORY)
    root = _NEW_ROOT
    mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    for name in _SYSTEM_DIRS:
        source = "/" + name
        if os.path.islink(source):
            os.symlink(os.readlink(source), f"{root}/{name}")
        elif os.path.isdir(source):
            os.mkdir(f"{root}/{name}", 0o755)
            _bind(source, f"{root}/{name}", flags=_MS_NODEV)
    _system_etc(root, config)
    _system_dev(root)
    for name, mode in (("proc", 0o555), ("sys", 0o555), ("tmp", 0o1777), ("run", 0o755), ("var", 0o755)):
        os.mkdir(f"{root}/{name}", mode)
    os.mkdir(root + "/var/tmp", 0o1777)
    for path, tmpfs_mode in (("/tmp", "1777"), ("/var/tmp", "1777"), ("/run", "0755")):
        mount("tmpfs", root + path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={tmpfs_mode},size=64m")
    mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    # A fresh sysfs shows this network namespace's interfaces (loopback), not the host's.
    mount("sysfs", root + "/sys", "sysfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
    # The runtime directory (sockets, the view's mount point) at the same path as on the host,
    # under directories nobody can list: other tasks' ids stay unknown.
    parent = root
    for part in runtime.strip("/").split("/"):
        parent = f"{parent}/{part}"
        if not os.path.isdir(parent):
            os.mkdir(parent, 0o711)
    mount(f"/proc/self/fd/{keep}", root + runtime, None, _MS_BIND)
    os.close(keep)
    check(_libc.syscall(_SYS_MOVE_MOUNT, config["view_fd"], b"", _AT_FDCWD, (root + view).encode(),
                         _MOVE_MOUNT_F_EMPTY_PATH), f"attach the view at {view}")
    os.close(config["view_fd"])
    if config.get("profile_fd") is not None:  # a browser profile folder, on the private /run
        os.mkdir(root + config["profile"], 0o700)
        check(_libc.syscall(_SYS_MOVE_MOUNT, config["profile_fd"], b"", _AT_FDCWD, (root + config["profile"]).encode(),
                             _MOVE_MOUNT_F_EMPTY_PATH), f"attach the profile at {config['profile']}")
        os.close(config["profile_fd"])
    os.mkdir(root + "/.old", 0o700)
    check(_libc.syscall(_SYS_PIVOT_ROOT, root.encode(), (root + "/.old").encode()), "pivot into the task's root")
    os.chdir("/")
    check(_libc.umount2(b"/.old", _MNT_DETACH), "detach the host's tree")
    os.rmdir("/.old")
    mount("none", "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


_SYS_OPEN_TREE, _OPEN_TREE_CLONE, _AT_RECURSIVE = 428, 0x1, 0x8000
_SCRATCH = (("/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None),
            ("/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m"),
            ("/var/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m"),
            ("/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m"),
            ("/run", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64m"))


def fresh_scratch(runtime: str) -> None:
    """Cover the run's /proc (this namespace's own now) and its temporary directories with new,
    empty ones, as ``build_root`` made them. The run's own stay beneath, not detached: a detach is
    most of this function's cost, and they go with the command's mount namespace; nothing reaches
    them (the command cannot unmount, and no command writes to them: each has its own on top).
    The runtime directory (the view in it) may live under one of them (a data directory under
    /tmp): it is cloned first and put back at its path."""
    inside = next((path for path, *_ in _SCRATCH if runtime.startswith(path + "/")), None)
    tree = -1
    if inside is not None:
        tree = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, runtime.encode(),
                             _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC)
        check(tree, f"keep the runtime directory {runtime}")
    for path, kind, flags, data in _SCRATCH:
        mount(kind, path, kind, flags, data)
    if inside is not None:
        parent = ""
        for part in runtime.strip("/").split("/")[:-1]:
            parent = f"{parent}/{part}"
            if not os.path.isdir(parent):
                os.mkdir(parent, 0o711)
        os.mkdir(runtime, 0o700)
        check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, runtime.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
               f"put the runtime directory back at {runtime}")
        os.close(tree)
