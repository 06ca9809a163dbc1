"""What one machine answers another (several machines, ``BOX_MACHINE``): reads of the tasks and
workspaces it holds, the owner's acts on them (undo, Keep, an upload), and a moving workspace's copy. Plain views outside the API: no owner signs
in here, a machine proves the box's shared secret (``tasks.machines.calls``), and the machine
that asked has already checked who may read what. Each reads this machine's disk, never asks
another machine in turn."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import IO, Any

from django.http import Http404, HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from boxsite.core.errors import BoxError, NotFound
from boxsite.core.principal import Principal
from tasks import verbs
from tasks.api.presenters import present_task
from tasks.api.views import artifact_response
from tasks.api.workspaces import file_response, local_diff, local_upload
from tasks.layers import workspaces
from tasks.machines import calls, moves
from tasks.models import Task

View = Callable[..., HttpResponseBase]


def machine_only(view: View) -> View:
    """A read only a machine of the box may ask; every error in the API's shape."""
    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return _answered(request, ("GET",), lambda: view(request, *args, **kwargs))
    return checked


def machine_acts(method: str) -> Callable[[Callable[..., HttpResponseBase]], View]:
    """An act another machine makes here for the principal it names (signed with it); no CSRF
    token: no browser comes here, and the signature is the proof. The view reads the body only
    as ``calls.signed_body`` gives it; an act that takes none has its (empty) body checked first."""
    def decorate(view: Callable[..., HttpResponseBase]) -> View:
        @functools.wraps(view)
        @csrf_exempt
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            def act() -> HttpResponseBase:
                body = calls.signed_body(request)
                if method != "PUT":
                    body.read(-1)
                return view(request, body, calls.principal_of(request), *args, **kwargs)
            return _answered(request, (method,), act)
        return checked
    return decorate


def _answered(request: HttpRequest, methods: tuple[str, ...], view: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    if request.method not in methods:
        refused = JsonResponse({"code": "METHOD_NOT_ALLOWED", "message": f"use {' or '.join(methods)}",
                                "field": None}, status=405)
        refused["Allow"] = ", ".join(methods)
        return refused
    if not calls.verified(request):
        return JsonResponse({"code": "FORBIDDEN", "message": "only a machine of this box may ask this",
                             "field": None}, status=403)
    try:
        return view()
    except BoxError as exc:
        return JsonResponse(exc.as_dict(), status=exc.status)
    except Http404 as exc:
        return JsonResponse({"code": "NOT_FOUND", "message": str(exc) or "not found", "field": None}, status=404)


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


@machine_acts("POST")
def task_undo(request: HttpRequest, body: IO[bytes], principal: Principal, task_id: str) -> HttpResponseBase:
    return JsonResponse(dict(present_task(verbs.undo_task(principal, task_id))))


@machine_acts("POST")
def task_keep(request: HttpRequest, body: IO[bytes], principal: Principal, task_id: str) -> HttpResponseBase:
    task, conflicts = verbs.keep_review(principal, task_id)
    return JsonResponse({**present_task(task), "conflicts": conflicts})


@machine_acts("PUT")
def workspace_upload(request: HttpRequest, body: IO[bytes], principal: Principal, name: str, path: str) -> HttpResponseBase:
    return JsonResponse(dict(local_upload(principal, name, path, body)), status=201)


@csrf_exempt
def workspace_file_write(request: HttpRequest, name: str, path: str) -> HttpResponseBase:
    """An upload made here (``PUT``), or the file read (``GET``): one path, as in the API."""
    if request.method == "PUT":
        return workspace_upload(request, name, path)
    return workspace_file(request, name, path)


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
