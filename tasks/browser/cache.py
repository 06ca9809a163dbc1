"""The grounding cache: what a ``describe`` target turned out to be, kept for the next run of the
same instruction on the same page (docs/internals/browser.md#grounding-and-its-cache).

An entry (``tasks.models.GroundingEntry``) belongs to one owner and one workspace and is keyed by
the page's origin and path and the instruction. It holds a Playwright selector (role and
accessible name first, a CSS path only when nothing else is unique) and the element's
fingerprint: its role, accessible name, text, label, the row it sits in and the heading above
it. ``tasks.browser.grounding`` replays an entry only when the element the selector finds still
has that fingerprint, and never for an instruction that depends on the page's data.

This module alone writes the table, and only once the action on the element succeeded. An entry
lives ``BOX_GROUNDING_CACHE_DAYS`` from the model's choice (a verified replay does not extend
it). The owner lists and clears entries through the API and the Settings page; no Playwright
here, so the API imports it freely.
"""
from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import F, QuerySet
from django.utils import timezone

from boxsite.core.errors import Forbidden, InvalidRequest, NotFound
from boxsite.core.principal import Principal
from boxsite.core.shapes import DateTime, Doc
from tasks.models import GroundingEntry, Task, Workspace

# Words that make an instruction's answer a matter of what the page shows now (its prices,
# dates, order), so what the model chose last time says nothing about this time. A false hit
# costs a model call; a miss could click yesterday's cheapest.
_DATA_WORDS = re.compile(
    r"\b(cheap\w*|dear\w*|pric(?:ey|ier|iest)|expensive|costl\w*|low(?:er|est)?|high(?:er|est)?|new(?:er|est)?|"
    r"late(?:r|st)?|old(?:er|est)?|earl(?:y|ier|iest)|recent\w*|first|last|second|third|fourth|fifth|next|"
    r"previous|top|bottom|best|better|worst|worse|most|least|fewest|big(?:ger|gest)|larg(?:e|er|est)|"
    r"small(?:er|est)?|fast(?:er|est)?|short(?:er|est)|long(?:er|est)|quick(?:er|est)|slow(?:er|est)|"
    r"soon(?:er|est)?|near(?:er|est)|closest|furthest|farthest|max(?:imum)?|min(?:imum)?|popular\w*|"
    r"rated|rating|sort\w*|order(?:ed)?\s+by|today|tonight|tomorrow|yesterday|monday|tuesday|wednesday|"
    r"thursday|friday|saturday|sunday|january|february|march|april|june|july|august|september|october|"
    r"november|december)\b",
    re.IGNORECASE)
# Numbers, dates, times and prices: digits or a currency sign anywhere.
_DATA_SIGNS = re.compile(r"\d|[$€£¥₹]")


def depends_on_data(instruction: str) -> str | None:
    """The word (or sign) that makes ``instruction`` depend on what the page shows, or None."""
    found = _DATA_WORDS.search(instruction) or _DATA_SIGNS.search(instruction)
    return found.group().lower() if found else None


def page_of(url: str) -> tuple[str, str]:
    """The (origin, path) an entry is kept under; the query and fragment are not part of it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}", parts.path or "/"


def _key(origin: str, path: str, instruction: str) -> str:
    return hashlib.sha256("\n".join((origin, path, instruction)).encode()).hexdigest()


def lifetime() -> timedelta | None:
    """How long an entry is replayed after the model chose it; None: the cache is off."""
    days = float(settings.BOX_GROUNDING_CACHE_DAYS)
    return timedelta(days=days) if days > 0 else None


def _live(qs: QuerySet[GroundingEntry]) -> QuerySet[GroundingEntry]:
    life = lifetime()
    if life is None:
        return qs.none()
    return qs.filter(grounded_at__gt=timezone.now() - life)


# -- the run's side ----------------------------------------------------------------------------
def find(task: Task, url: str, instruction: str) -> GroundingEntry | None:
    """The live entry for ``instruction`` on the page at ``url`` in ``task``'s owner's workspace."""
    origin, path = page_of(url)
    mine = GroundingEntry.objects.filter(owner_id=task.owner_id, workspace_id=task.workspace_id,
                                         key=_key(origin, path, instruction))
    return _live(mine).first()


def remember(task: Task, url: str, instruction: str, *, kind: str, selector: str, fingerprint: dict[str, Any]) -> None:
    """Keep what the model found, once the action on it succeeded (and the cache is on). Two
    workers grounding the same instruction at once each write a row they verified; the unique
    key makes that one row, the later write winning (``update_or_create`` locks the row it
    updates, and retries a create that lost the race as an update)."""
    life = lifetime()
    if life is None:
        return
    origin, path = page_of(url)
    now = timezone.now()
    GroundingEntry.objects.filter(owner_id=task.owner_id, grounded_at__lte=now - life).delete()
    GroundingEntry.objects.update_or_create(
        owner_id=task.owner_id, workspace_id=task.workspace_id, key=_key(origin, path, instruction),
        defaults={"origin": origin[:300], "path": path[:1000], "instruction": instruction[:500], "kind": kind,
                  "selector": selector[:2000], "fingerprint": fingerprint, "task_id": task.pk, "grounded_at": now,
                  "used_at": None, "uses": 0})


def record_use(entry_id: int, task: Task) -> None:
    """A replay verified the entry's element and the action on it succeeded."""
    GroundingEntry.objects.filter(pk=entry_id).update(uses=F("uses") + 1, used_at=timezone.now(), task_id=task.pk)


# -- the owner's side (API, Settings) ----------------------------------------------------------
class GroundingEntryView(TypedDict):
    """a remembered element: replayed for the same instruction on the same page while its
    fingerprint still matches, until it expires"""

    id: int
    workspace: str
    origin: str
    path: str
    instruction: str
    kind: Annotated[str, Doc("the step that acted on it: click or fill")]
    selector: Annotated[str, Doc("the Playwright selector replayed (role and name first, a CSS path last)")]
    fingerprint: Annotated[dict[str, str], Doc("what the element must still be: role, name, text, label, row, heading")]
    task: Annotated[str, Doc("the task whose action confirmed it last")]
    groundedAt: Annotated[DateTime, Doc("when the model chose it")]
    expiresAt: DateTime
    usedAt: DateTime | None
    uses: Annotated[int, Doc("replays with no model call")]


class GroundingPage(TypedDict):
    results: Annotated[list[GroundingEntryView], Doc("the caller's live entries, newest first")]
    next: str | None


class Cleared(TypedDict):
    cleared: Annotated[int, Doc("entries removed")]


def present_entry(entry: GroundingEntry) -> GroundingEntryView:
    life = lifetime() or timedelta(0)
    return {"id": entry.pk, "workspace": entry.workspace.name, "origin": entry.origin, "path": entry.path,
            "instruction": entry.instruction, "kind": entry.kind, "selector": entry.selector,
            "fingerprint": {str(k): str(v) for k, v in (entry.fingerprint or {}).items()}, "task": entry.task_id,
            "groundedAt": entry.grounded_at.isoformat(), "expiresAt": (entry.grounded_at + life).isoformat(),
            "usedAt": entry.used_at.isoformat() if entry.used_at else None, "uses": entry.uses}


def _owner_only(principal: Principal) -> None:
    # What the owner's browsing learned is theirs: a phone or a running task neither reads nor clears it.
    if not principal.can_change_settings:
        raise Forbidden("only the owner (browser or API token) lists and clears the grounding cache")


def entries_for(principal: Principal, workspace: str | None = None) -> QuerySet[GroundingEntry]:
    """``principal``'s live entries, in one workspace when ``workspace`` names one."""
    _owner_only(principal)
    mine = GroundingEntry.objects.filter(owner=principal.user).select_related("workspace")
    if workspace is not None:
        if not Workspace.objects.filter(name=workspace).exists():
            raise InvalidRequest(f"no workspace '{workspace}'", field="workspace")
        mine = mine.filter(workspace__name=workspace)
    return _live(mine)


def clear(principal: Principal, workspace: str | None = None) -> int:
    """Remove ``principal``'s entries (of one workspace, or all, expired ones too); how many."""
    _owner_only(principal)
    mine = GroundingEntry.objects.filter(owner=principal.user)
    if workspace is not None:
        if not Workspace.objects.filter(name=workspace).exists():
            raise InvalidRequest(f"no workspace '{workspace}'", field="workspace")
        mine = mine.filter(workspace__name=workspace)
    removed, _ = mine.delete()
    return removed


def forget(principal: Principal, entry_id: int) -> None:
    """Remove one of ``principal``'s entries; another owner's is not found."""
    _owner_only(principal)
    removed, _ = GroundingEntry.objects.filter(owner=principal.user, pk=entry_id).delete()
    if not removed:
        raise NotFound(f"no grounding entry {entry_id}")
