"""Task templates of schedules and triggers: checked when saved, filled in when they fire.

A template is an ordinary task spec (docs/internals/task-lifecycle.md#the-task-spec) without ``source`` (the box sets it). Facts a
firing supplies (a webhook's payload, an arrived file's path) are added to the template's own
facts; the template's facts win on a name clash, so a payload cannot override what the owner
wrote. ``${name}`` in the title and prompt is filled from the non-secret facts when the task is
created; in a flow it is resolved by the flow worker at the moment a step runs, as for any task.
Secret facts are never substituted into the title or prompt: they stay ``${name}``.
"""
from __future__ import annotations

import re
from typing import Any

from boxsite.core.errors import BoxError, InvalidSpec
from boxsite.core.principal import Principal, Via
from tasks.spec.task import parse_spec
from tasks.vault.facts import Facts

_NAME = re.compile(r"\$\{([^}]+)\}")
TITLE_MAX = 200


def firing_principal(owner: Any, via: Via) -> Principal:
    """Who a schedule or trigger acts as when it fires: the box, on the owner's behalf. It may
    not hand out folders (only the owner in person can), so templates cannot either."""
    return Principal.system(owner, via=via)


def check_template(template: Any, owner: Any, *, via: Via, source: str) -> dict[str, Any]:
    """The template if it would create a task now, else the spec error with ``template.`` in
    front of its field. Creates nothing."""
    if not isinstance(template, dict):
        raise InvalidSpec("'template' must be a task spec (a JSON object)", field="template")
    if "source" in template:
        raise InvalidSpec("a template cannot set 'source'; the box sets it when it fires", field="template.source")
    try:
        parse_spec(template, firing_principal(owner, via), source=source)
    except BoxError as exc:
        raise type(exc)(exc.message, field=f"template.{exc.field}" if exc.field else "template", **exc.extra) from exc
    return template


def fill(template: dict[str, Any], facts: dict[str, str]) -> dict[str, Any]:
    """The spec a firing creates: the template plus ``facts``, with ``${...}`` filled in the
    title and prompt from facts that are not secret."""
    body = dict(template)
    own = dict(template.get("facts") or {})
    merged = {**facts, **own}
    if merged:
        body["facts"] = merged
    shared = Facts.build(merged, template.get("secretFacts") or []).shared()
    for key in ("title", "prompt"):
        if isinstance(body.get(key), str):
            body[key] = _NAME.sub(lambda m: str(shared[m.group(1)]) if m.group(1) in shared else m.group(0), body[key])
    if isinstance(body.get("title"), str):
        body["title"] = body["title"][:TITLE_MAX].strip() or "untitled"
    return body
