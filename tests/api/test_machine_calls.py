"""What one machine answers another (``/internal/machine/``): only a call signed with the box's
shared secret, and always in the API's error shape."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from boxsite.core.principal import Principal, Via
from boxsite.mcp import tools
from boxsite.models import ApiToken
from tasks.machines import calls
from tasks.models import Machine, Task, Workspace
from tests.conftest import Box
from tests.factories import flow, make_owner
from tests.http_server import Handler, serving

SECRET = "s" * 40


def _get(path: str, signature: str | None) -> Any:
    headers = {calls.HEADER: signature} if signature is not None else {}
    return Client().get(path, headers=headers)


def test_an_unsigned_or_wrongly_signed_call_is_refused_and_a_signed_one_answered(box: Box, settings: Any) -> None:
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "a", SECRET
    path = "/internal/machine/tasks/tknosuchtask/diff"
    assert _get(path, None).status_code == 403
    assert _get(path, "1.abc").json()["code"] == "FORBIDDEN"
    settings.BOX_MACHINE_SECRET = "t" * 40
    wrong = calls.sign("GET", path)
    settings.BOX_MACHINE_SECRET = SECRET
    assert _get(path, wrong).status_code == 403
    answered = _get(path, calls.sign("GET", path))
    assert answered.status_code == 404 and answered.json()["code"] == "NOT_FOUND"


def test_one_machine_answers_no_machine_call(box: Box, settings: Any) -> None:
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "", SECRET
    path = "/internal/machine/workspaces/home/files"
    assert _get(path, calls.sign("GET", path)).status_code == 403


def _act(method: str, path: str, principal: Principal, body: bytes = b"", *, who: str | None = None,
         signed_body: bytes | None = None) -> Any:
    """An act as another machine makes it; ``who``/``signed_body``: what was signed, when the
    request carries something else."""
    signed_for = calls.principal_header(principal)
    digest = hashlib.sha256(body if signed_body is None else signed_body).hexdigest()
    headers = {calls.HEADER: calls.sign(method, path, signed_for, digest), calls.PRINCIPAL_HEADER: who or signed_for,
               calls.DIGEST_HEADER: digest}
    return Client().generic(method, path, body, content_type="application/octet-stream", headers=headers)


def test_an_act_is_made_as_the_principal_it_was_signed_for_and_no_other(box: Box, settings: Any) -> None:
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "a", SECRET
    owner = Principal.of_credential(box.owner, ApiToken.objects.get(user=box.owner))
    path = "/internal/machine/workspaces/home/files/notes/up.txt"
    made = _act("PUT", path, owner, b"uploaded\n")
    assert made.status_code == 201, made.json()
    assert made.json()["task"]["source"] == "upload"
    assert box.api.get("/api/workspaces/home/files", {"path": "notes/up.txt"}).json()["content"] == "uploaded\n"

    task_id = made.json()["task"]["id"]
    undo = f"/internal/machine/tasks/{task_id}/undo"
    # The principal swapped after signing (a paired phone's, say): the signature no longer holds.
    stranger = calls.principal_header(Principal.session(make_owner()))
    assert _act("POST", undo, owner, who=stranger).status_code == 403
    assert box.task(task_id)["state"] == "done"
    undone = _act("POST", undo, owner)
    assert undone.status_code == 200 and undone.json()["state"] == "undone"
    again = _act("POST", undo, owner)  # the verb's own refusal, in the error shape
    assert again.status_code == 409 and again.json()["code"]
    # A principal of no user of this box is refused, not guessed.
    ghost = Principal(User(pk=10**9, username="ghost"), Via.TOKEN)
    assert _act("POST", undo, ghost).json()["code"] == "FORBIDDEN"


def test_an_act_whose_body_is_not_the_one_signed_is_refused_and_leaves_nothing(box: Box, settings: Any) -> None:
    """A signature seen on the machines' network, put on another body within its minute."""
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "a", SECRET
    owner = Principal.of_credential(box.owner, ApiToken.objects.get(user=box.owner))
    path = "/internal/machine/workspaces/home/files/notes/swapped.txt"
    swapped = _act("PUT", path, owner, b"the attacker's bytes\n", signed_body=b"the owner's bytes\n")
    assert swapped.status_code == 403 and swapped.json()["code"] == "FORBIDDEN", swapped.json()
    assert "not the one the machine signed" in swapped.json()["message"]
    assert not Task.objects.filter(source="upload").exists()
    assert box.api.get("/api/workspaces/home/files", {"path": "notes/swapped.txt"}).status_code == 404
    # The digest header changed to match the new body: the signature no longer holds.
    signed_for = calls.principal_header(owner)
    headers = {calls.HEADER: calls.sign("PUT", path, signed_for, hashlib.sha256(b"the owner's bytes\n").hexdigest()),
               calls.PRINCIPAL_HEADER: signed_for, calls.DIGEST_HEADER: hashlib.sha256(b"x").hexdigest()}
    assert Client().generic("PUT", path, b"x", content_type="application/octet-stream", headers=headers).status_code == 403
    # An act that takes no body, sent one.
    task = box.create(title="plain", flow=flow({"run": "true"}))
    box.wait_state(task["id"], "done", timeout=60)
    undo = _act("POST", f"/internal/machine/tasks/{task['id']}/undo", owner, b"{}", signed_body=b"")
    assert undo.status_code == 403 and box.task(task["id"])["state"] == "done"
    assert _act("PUT", path, owner, b"the owner's bytes\n").status_code == 201


def test_a_keep_act_answers_in_the_error_shape_and_a_wrong_method_too(box: Box, settings: Any) -> None:
    task = box.create(title="plain", flow=flow({"run": "true"}))
    box.wait_state(task["id"], "done", timeout=60)
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "a", SECRET
    owner = Principal.of_credential(box.owner, ApiToken.objects.get(user=box.owner))
    kept = _act("POST", f"/internal/machine/tasks/{task['id']}/keep", owner)
    assert kept.status_code == 409 and kept.json()["field"] == "review"  # not a folder task: the verb's refusal
    assert _act("POST", "/internal/machine/tasks/tknosuchtask/keep", owner).json()["code"] == "NOT_FOUND"
    wrong = _act("GET", "/internal/machine/tasks/tknosuchtask/undo", owner)
    assert wrong.status_code == 405 and wrong.json()["code"] == "METHOD_NOT_ALLOWED"
    assert _act("DELETE", "/internal/machine/workspaces/home/files/a.txt", owner).status_code == 405


def test_mcp_lists_another_machines_workspace_through_that_machine(box: Box, settings: Any) -> None:
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "a", SECRET
    asked: list[tuple[str, bool]] = []

    class Holder(Handler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            stamp, _, given = self.headers.get(calls.HEADER, "").partition(".")
            asked.append((self.path, given == calls._signature(stamp, "GET", self.path)))
            entry = {"workspace": "far", "path": "notes", "type": "dir", "entries": [
                {"name": "on-b.txt", "path": "notes/on-b.txt", "type": "file", "size": 3}]}
            self.reply(200, json.dumps(entry).encode(), {"Content-Type": "application/json"})

    with serving(Holder) as port:
        Machine.objects.create(name="b", url=f"http://127.0.0.1:{port}", beat_at=timezone.now())
        Workspace.objects.create(name="far", base_dir="far", machine="b")
        owner = Principal.of_credential(box.owner, ApiToken.objects.get(user=box.owner))
        listed = tools.TOOLS["list_files"].run(owner, {"workspace": "far", "path": "notes"})
    assert [entry["name"] for entry in listed["entries"]] == ["on-b.txt"]
    assert asked == [("/internal/machine/workspaces/far/files?path=notes", True)]
