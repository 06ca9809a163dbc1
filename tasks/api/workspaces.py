"""The workspace, diff and keep API. Each view: check input, call one service, present."""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import IO, Annotated, TypedDict
from urllib.parse import quote, urlencode

from django.conf import settings
from django.http import FileResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core.negotiation import answers_any_type
from boxsite.core.principal import Principal
from boxsite.core.shapes import Doc, shape
from tasks import services, verbs
from tasks.api.presenters import TaskView, present_task
from tasks.layers import diff, uploads, workspaces
from tasks.layers.roots import diff_body
from tasks.layers.workspaces import WorkspaceBody, WorkspaceEntry, WorkspacePage, WorkspaceView
from tasks.machines import calls, homes, moves
from tasks.models import Layer, Task, Workspace
from tasks.states import State
from tasks.vault.facts import redactor_for

UPLOAD_CHUNK = 1 << 20  # what a forwarded upload reads of the body at a time


class TaskKept(TaskView):
    conflicts: Annotated[list[str], Doc("paths the owner changed too: Keep did not apply them")]


@extend_schema(methods=["GET"], operation_id="workspaces_list", responses={200: shape(WorkspacePage)})
@extend_schema(methods=["POST"], request=WorkspaceBody, responses={201: shape(WorkspaceView)})
@api_view(["GET", "POST"])
def workspace_list(request: Request) -> Response:
    principal = Principal.of(request)
    if request.method == "POST":
        workspace = workspaces.create_workspace(principal, request.data)
        return Response(workspaces.present_workspace(workspace), status=201)
    return Response(workspace_page())


def workspace_page() -> WorkspacePage:
    listed: WorkspacePage = {"results": [workspaces.present_workspace(w) for w in Workspace.objects.order_by("name")]}
    return listed


@extend_schema(responses={200: shape(WorkspaceView)})
@api_view(["GET"])
def workspace_detail(request: Request, name: str) -> Response:
    return Response(workspaces.present_workspace(workspaces.get_workspace(name)))


@extend_schema(request=moves.MoveBody, responses={202: shape(WorkspaceView)},
               description="Several machines: copy the workspace's layers to another machine and run its tasks "
                           "there from then on. Its tasks wait while it moves (movingTo).")
@api_view(["POST"])
def workspace_move(request: Request, name: str) -> Response:
    moved = moves.ask_move(Principal.of(request), workspaces.get_workspace(name), request.data)
    return Response(workspaces.present_workspace(moved), status=202)


@extend_schema(request=moves.AbandonBody, responses={202: shape(WorkspaceView)},
               description="Several machines: give up a workspace whose machine is gone with its disk. It "
                           "starts afresh, empty, on a live machine; its done tasks are undone and those not "
                           "over fail, each saying its work was lost. Refused while its machine is alive.")
@api_view(["POST"])
def workspace_abandon(request: Request, name: str) -> Response:
    abandoned = moves.ask_abandon(Principal.of(request), workspaces.get_workspace(name), request.data)
    return Response(workspaces.present_workspace(abandoned), status=202)


@extend_schema(parameters=[OpenApiParameter("path", str, description="relative to the workspace root")],
               responses={200: shape(WorkspaceEntry)})
@api_view(["GET"])
def workspace_files(request: Request, name: str) -> Response:
    return Response(browse_of(workspaces.get_workspace(name), request.query_params.get("path")))


def browse_of(workspace: Workspace, path: str | None) -> WorkspaceEntry:
    """A listing or file of ``workspace`` as it stands now, read by the machine that holds it."""
    holder = homes.workspace_home(workspace) if settings.BOX_MACHINE else ""
    if homes.away(holder):  # its files are on another machine's disk: that machine reads them
        query = urlencode({"path": path}) if path is not None else ""
        asked: WorkspaceEntry = calls.read_json(holder, f"{calls.PREFIX}/workspaces/{workspace.name}/files"
                                                  + (f"?{query}" if query else ""))
        return asked
    return workspaces.browse(workspace, path)


class Uploaded(TypedDict):
    """A file put into a workspace: its layer is the layer of ``task``, done at once (undo it to take the file out)."""

    workspace: str
    path: str
    size: Annotated[int, Doc("bytes written")]
    task: Annotated[TaskView, Doc("the upload's task (source 'upload'), in the workspace's history")]


FILE_PATH = OpenApiParameter("path", str, OpenApiParameter.PATH,
                             description="the file, relative to the workspace's root (may hold '/')")


@extend_schema(methods=["GET"], operation_id="workspaces_file_read", parameters=[FILE_PATH],
               description="The file's bytes as the workspace stands now, as an attachment; its type guessed "
                           "from its name.",
               responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
@extend_schema(methods=["PUT"], operation_id="workspaces_file_write", parameters=[FILE_PATH],
               description="The raw body (at most BOX_UPLOAD_MAX_MB) becomes the file, as a layer of its own "
                           "recorded by a done task (source 'upload'): undo that task to take the file out.",
               request={"application/octet-stream": OpenApiTypes.BINARY}, responses={201: shape(Uploaded)})
@api_view(["GET", "PUT"])
@answers_any_type
def workspace_file(request: Request, name: str, path: str) -> Response | HttpResponseBase:
    """PUT: the raw body becomes the file at ``path``, as a layer of its own (at most
    ``BOX_UPLOAD_MAX_MB``). GET: the file's bytes as the workspace stands now."""
    if request.method == "PUT":
        principal = Principal.of(request)
        if settings.BOX_MACHINE:
            holder = homes.workspace_home(workspaces.get_workspace(name))
            if homes.away(holder):  # the file becomes a layer on the disk that holds the workspace
                return Response(forward_upload(holder, principal, name, path, request), status=201)
        return Response(local_upload(principal, name, path, request.stream or io.BytesIO()), status=201)
    if settings.BOX_MACHINE:
        holder = homes.workspace_home(workspaces.get_workspace(name))
        if homes.away(holder):
            return calls.relay(holder, request)
    return file_response(name, path)


def local_upload(principal: Principal, name: str, path: str, body: IO[bytes]) -> Uploaded:
    """An upload written on this machine's disk."""
    done = uploads.upload_file(principal, name, path, body)
    return {"workspace": name, "path": done.path, "size": done.size, "task": present_task(done.task)}


def forward_upload(holder: str, principal: Principal, name: str, path: str, request: Request) -> Uploaded:
    """An upload made by the machine that holds the workspace. The body is read first, up to one
    byte past the limit (the holder refuses it then), into a private temporary file, so the call
    can sign its digest."""
    stream = request.stream or io.BytesIO()
    limit, digest, size = uploads.max_bytes() + 1, hashlib.sha256(), 0
    with tempfile.TemporaryFile() as body:
        while size < limit and (chunk := stream.read(min(UPLOAD_CHUNK, limit - size))):
            digest.update(chunk)
            body.write(chunk)
            size += len(chunk)
        body.seek(0)
        full_path = f"{calls.PREFIX}/workspaces/{name}/files/{quote(path)}"
        answer: Uploaded = calls.act(holder, "PUT", full_path, principal, body, digest=digest.hexdigest(),
                                     headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
    return answer


def file_response(name: str, path: str) -> FileResponse:
    """The bytes of the workspace's file as it stands now, read on this machine."""
    found = uploads.open_file(name, path)
    response = FileResponse(os.fdopen(found.fd, "rb"), content_type=found.content_type, as_attachment=True,
                            filename=found.name)
    if found.content_type.startswith("text/"):
        response["Content-Type"] += "; charset=utf-8"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"  # never a page of the box's origin
    return response


@extend_schema(responses={200: shape(diff.Diff)})
@api_view(["GET"])
def task_diff(request: Request, task_id: str) -> Response:
    return Response(diff_of(services.get_task_for(Principal.of(request), task_id)))


def diff_of(task: Task) -> diff.Diff:
    """What ``task`` changed in its workspace, redacted; read by the machine that holds its layer."""
    holder = homes.holder_of(task) if settings.BOX_MACHINE else ""
    if homes.away(holder):
        asked: diff.Diff = calls.read_json(holder, calls.internal_path(f"/api/tasks/{task.pk}/diff"))
        return asked
    return local_diff(task)


def local_diff(task: Task) -> diff.Diff:
    """``diff_of`` read from this machine's disk."""
    layer = Layer.objects.filter(task=task).first()
    if layer is None or task.state == State.UNDONE:
        unchanged: diff.Diff = {"task": task.pk, **diff.empty()}
        return unchanged  # never started, or its changes are gone

    # A task's files may hold what its steps typed (a password, a card): shown only redacted.
    changed: diff.Diff = {"task": task.pk, **diff_body(task, layer)}
    return redactor_for(task).redact(changed)


@extend_schema(request=None, responses={200: shape(TaskKept)})
@api_view(["POST"])
def task_keep(request: Request, task_id: str) -> Response:
    task, conflicts = verbs.keep_review(Principal.of(request), task_id)
    kept: TaskKept = {**present_task(task), "conflicts": conflicts}
    return Response(kept)
