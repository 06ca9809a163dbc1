"""What one machine answers another (several machines, ``BOX_MACHINE``): reads of the tasks and
workspaces it holds, and a moving workspace's copy. Plain views outside the API: no owner signs
in here, a machine proves the box's shared secret (``tasks.machines.calls``), and the machine
that asked has already checked who may read what. Each reads this machine's disk, never asks
another machine in turn."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from django.http import Http404, HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from boxsite.core.errors import BoxError, NotFound
from tasks.api.views import artifact_response
from tasks.api.workspaces import file_response, local_diff
from tasks.layers import workspaces
from tasks.machines import calls, moves
from tasks.models import Task

View = Callable[..., HttpResponseBase]


def machine_only(view: View) -> View:
    """Only a machine of the box; every error in the API's shape."""
    @functools.wraps(view)
    @require_GET
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not calls.verified(request):
            return JsonResponse({"code": "FORBIDDEN", "message": "only a machine of this box may ask this",
                                 "field": None}, status=403)
        try:
            return view(request, *args, **kwargs)
        except BoxError as exc:
            return JsonResponse(exc.as_dict(), status=exc.status)
        except Http404 as exc:
            return JsonResponse({"code": "NOT_FOUND", "message": str(exc) or "not found", "field": None}, status=404)
    return checked


def _task(task_id: str) -> Task:
    task = Task.objects.select_related("workspace").filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"no task '{task_id}'", field="task")
    return task


@machine_only
def task_diff(request: HttpRequest, task_id: str) -> HttpResponseBase:
    return JsonResponse(local_diff(_task(task_id)))


@machine_only
def task_artifact(request: HttpRequest, task_id: str, name: str) -> HttpResponseBase:
    return artifact_response(_task(task_id), name)


@machine_only
def workspace_files(request: HttpRequest, name: str) -> HttpResponseBase:
    return JsonResponse(workspaces.browse(workspaces.get_workspace(name), request.GET.get("path")))


@machine_only
def workspace_file(request: HttpRequest, name: str, path: str) -> HttpResponseBase:
    return file_response(name, path)


@machine_only
def workspace_export(request: HttpRequest, name: str) -> HttpResponseBase:
    """The workspace's base, layers and artifacts as a tar stream, for the machine it moves to."""
    tar = moves.export(workspaces.get_workspace(name))
    assert tar.stdout is not None

    def chunks() -> Iterator[bytes]:
        try:
            while chunk := tar.stdout.read(1 << 20):  # type: ignore[union-attr]
                yield chunk
        finally:
            tar.stdout.close()  # type: ignore[union-attr]
            tar.wait()

    return StreamingHttpResponse(chunks(), content_type="application/x-tar")
