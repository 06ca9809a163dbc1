"""Whether this box can sandbox tasks, and if not, why (said plainly; never pretended).

A box is in one of three modes (``standing()``): ``root`` (every task sandboxed), ``off`` (the
owner set ``BOX_SANDBOX=off``: tasks run as the box's own user, knowingly) or ``refused`` (it
cannot sandbox and was not told to run without: every task fails at its start with ``refusal()``
and nothing of it runs). The banner of ``runbox``, Settings, ``/api/health`` and ``doctor`` all
say the mode from here.
"""
from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from django.conf import settings

from tasks.sandbox import syscall_filter

SYSTEM_PYTHON = Path("/usr/bin/python3")
INIT = Path(__file__).with_name("init.py")  # the sandbox's PID 1 (and its keyring sweeper)
_TOOLS = ("unshare", "useradd", "userdel", "groupdel")
OFF_REASON = "the sandbox is turned off (BOX_SANDBOX=off)"
FIX = "run the box as root (sudo), or set BOX_SANDBOX=off to run tasks unsandboxed, as the box's own user, knowingly"


Mode = Literal["root", "off", "refused"]


@dataclass(frozen=True)
class Standing:
    """The box's sandbox mode; ``missing``: what it lacks to sandbox (also when it is off)."""

    mode: Mode
    missing: tuple[str, ...]

    @property
    def sandboxed(self) -> bool:
        return self.mode == "root"

    @property
    def reason(self) -> str | None:
        """None when tasks are sandboxed; else why not, in one line."""
        if self.mode == "off":
            return OFF_REASON
        return "; ".join(self.missing) or None

    @property
    def summary(self) -> str:
        if self.mode == "root":
            return "sandboxed as root: a Linux user and namespaces per task, the system-call filter"
        if self.mode == "off":
            return "off by the owner (BOX_SANDBOX=off): tasks run unsandboxed, as the box's own user"
        return f"refused: tasks do not run, since the box cannot sandbox them ({self.reason})"


def standing() -> Standing:
    missing = tuple(_missing())
    if getattr(settings, "BOX_SANDBOX", "auto") == "off":
        return Standing("off", missing)
    return Standing("refused" if missing else "root", missing)


def _missing() -> list[str]:
    found = [] if os.geteuid() == 0 else ["the box is not running as root"]
    return found + list(_system_missing())


@functools.cache
def _system_missing() -> tuple[str, ...]:
    found = []
    if not os.path.exists("/proc/self/ns/net"):
        found.append("this system has no Linux namespaces")
    found += [f"'{tool}' is not found on PATH" for tool in _TOOLS if shutil.which(tool) is None]
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        found.append(f"{SYSTEM_PYTHON} is missing (the sandbox's init runs on it)")
    problem = syscall_filter.unavailable()
    if problem is not None:
        found.append(f"the system-call filter cannot be had: {problem} (apt install libseccomp2)")
    return tuple(found)


def missing_reason() -> str | None:
    """None when the sandbox is in force; otherwise the reason it is not."""
    return standing().reason


def available() -> bool:
    return standing().sandboxed


def refusal() -> str | None:
    """The error a task gets at its start on a box that refuses to run tasks, or None."""
    found = standing()
    if found.mode != "refused":
        return None
    return (f"not run: this box cannot sandbox tasks ({found.reason}) and runs none unsandboxed unless told; "
            f"to run tasks, {FIX}")
