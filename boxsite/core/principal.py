"""Who is asking: the owner in a browser, a program with a token, a paired phone, or the box."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.contrib.auth.models import User

from boxsite.models import ApiToken, Device


class Via(StrEnum):
    """How a principal reached the box."""

    SESSION = "session"  # the owner, signed in to the portal
    TOKEN = "token"  # a program with one of the owner's API tokens
    DEVICE = "device"  # a paired phone
    SCHEDULE = "schedule"  # the box firing a schedule on the owner's behalf
    WEBHOOK = "webhook"  # ... a webhook trigger
    FILE = "file"  # ... a file-arrival trigger
    TASK = "task"  # a running task, through its broker (tasks.tools.delegation)
    SYSTEM = "system"  # the box itself


@dataclass(frozen=True)
class Principal:
    """Who may see and act on what is decided once, by ``tasks.models.TaskQuerySet``."""

    user: User
    via: Via
    token: ApiToken | None = None
    device: Device | None = None
    task: Any = None  # Via.TASK: the task asking (a tasks.models.Task)
    run: int | None = None  # Via.TASK: the number of its run that asked

    @property
    def is_phone(self) -> bool:
        return self.via == Via.DEVICE

    @property
    def can_use_folders(self) -> bool:
        """Only the owner hands out folders: a session, or a token given that right."""
        if self.via == Via.SESSION:
            return True
        if self.via == Via.TOKEN:
            return bool(self.token and self.token.can_use_folders)
        if self.via == Via.TASK:
            return True  # only folders within its own: tasks.tools.delegation bounds them before any spec is read
        return False

    @property
    def can_upload(self) -> bool:
        """Files go into a workspace from the owner's session or any of their API tokens: a
        token may already write any file through a task's ``write`` step (docs/internals/decisions.md)."""
        return self.via in (Via.SESSION, Via.TOKEN)

    @property
    def can_change_settings(self) -> bool:
        return self.via in (Via.SESSION, Via.TOKEN)

    @classmethod
    def of(cls, request: Any) -> Principal:
        """The principal of an authenticated request (DRF: ``request.auth`` tells token from device)."""
        return cls.of_credential(request.user, getattr(request, "auth", None))

    @classmethod
    def of_credential(cls, user: User, auth: Any) -> Principal:
        """The principal ``auth`` (an API token, a paired phone's device, else a session) names."""
        if isinstance(auth, ApiToken):
            return cls(user, Via.TOKEN, token=auth)
        if isinstance(auth, Device):
            return cls(user, Via.DEVICE, device=auth)
        return cls(user, Via.SESSION)

    @classmethod
    def session(cls, user: User) -> Principal:
        return cls(user, Via.SESSION)

    @classmethod
    def phone(cls, device: Device) -> Principal:
        return cls(device.user, Via.DEVICE, device=device)

    @classmethod
    def of_task(cls, task: Any, run: int) -> Principal:
        """A running task acting for the owner (``tasks.tools.delegation``)."""
        return cls(task.owner, Via.TASK, task=task, run=run)

    @classmethod
    def system(cls, user: User, via: Via = Via.SYSTEM) -> Principal:
        return cls(user, via)
