"""Whether this box can sandbox tasks, and if not, why (said plainly; never pretended)."""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from django.conf import settings

SYSTEM_PYTHON = Path("/usr/bin/python3")
INIT = Path(__file__).with_name("init.py")  # the sandbox's PID 1 (and its keyring sweeper)
# Where Debian's python3-seccomp (libseccomp's own binding) puts its module for the system Python.
SECCOMP_MODULE_DIRS = (Path("/usr/lib/python3/dist-packages"),)
_TOOLS = ("unshare", "useradd", "userdel", "groupdel")


def missing_reason() -> str | None:
    """None when the sandbox is in force; otherwise the reason it is not."""
    mode = getattr(settings, "BOX_SANDBOX", "auto")
    if mode == "off":
        return "the sandbox is turned off (BOX_SANDBOX=off)"
    if os.geteuid() != 0:
        return "the box is not running as root"
    return _system_reason()


@functools.cache
def _system_reason() -> str | None:
    if not os.path.exists("/proc/self/ns/net"):
        return "this system has no Linux namespaces"
    for tool in _TOOLS:
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing (the sandbox's init runs on it)"
    return None


def available() -> bool:
    return missing_reason() is None


@functools.cache
def syscall_filter_dir() -> str | None:
    """The directory holding the system Python's ``seccomp`` module, or None when it is missing
    (then tasks run without the system-call filter, and ``/api/health`` says so)."""
    for directory in SECCOMP_MODULE_DIRS:
        if any(directory.glob("seccomp*.so")):
            return str(directory)
    return None
