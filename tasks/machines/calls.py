"""One machine asking another: reads of what the other holds, the owner's acts on its disk
(undo, Keep, an upload), and a moving workspace's layers.

A call is a plain HTTP request to the holding machine's web process (its ``BOX_MACHINE_URL``)
under ``/internal/machine/``, signed with ``BOX_MACHINE_SECRET``: an HMAC of the time, the method,
the full path, the body's SHA-256 and (for an act) the principal it is made for, taken for 60
seconds. The holder reads a body only through ``signed_body``, which refuses one that is not the
body signed, so a signature seen on the network carries no other upload. For a read the
caller has already checked who may read what; the holder checks only that the call comes from a
machine of the box. An act carries its principal (``X-Box-Principal``), and the holder makes it
as that principal, with every check it makes on one machine.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase

from boxsite.core.errors import BoxError, Forbidden
from boxsite.core.principal import Principal, Via
from boxsite.models import ApiToken, Device
from tasks.machines import homes
from tasks.models import Task

HEADER = "X-Box-Machine"
PRINCIPAL_HEADER = "X-Box-Principal"
DIGEST_HEADER = "X-Box-Body-Digest"
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
PREFIX = "/internal/machine"
FRESH_S = 60
TIMEOUT_S = 30.0
# What a relayed answer keeps of the holder's headers.
KEPT_HEADERS = ("Content-Type", "Content-Disposition", "Content-Length", "X-Content-Type-Options",
                "Content-Security-Policy")


class MachineUnreachable(BoxError):
    code = "MACHINE_UNREACHABLE"
    status = 503


def _signature(stamp: str, method: str, full_path: str, who: str = "", digest: str = EMPTY_DIGEST) -> str:
    message = f"{stamp}\n{method}\n{full_path}\n{digest}" + (f"\n{who}" if who else "")
    return hmac.new(settings.BOX_MACHINE_SECRET.encode(), message.encode(), hashlib.sha256).hexdigest()


def sign(method: str, full_path: str, who: str = "", digest: str = EMPTY_DIGEST) -> str:
    """The signature header of a call; ``digest``: the SHA-256 (hex) of its body."""
    stamp = str(int(time.time()))
    return f"{stamp}.{_signature(stamp, method, full_path, who, digest)}"


def verified(request: HttpRequest) -> bool:
    """The request comes from a machine of this box (and the box has several). Its body is
    checked only as it is read (``signed_body``)."""
    if not settings.BOX_MACHINE:
        return False
    stamp, _, given = request.headers.get(HEADER, "").partition(".")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > FRESH_S:
        return False
    return hmac.compare_digest(given, _signature(stamp, request.method or "GET", request.get_full_path(),
                                                 request.headers.get(PRINCIPAL_HEADER, ""),
                                                 request.headers.get(DIGEST_HEADER, EMPTY_DIGEST)))


class SignedBody:
    """A verified request's body as a file, hashed as it is read: reaching its end with other
    bytes than those signed raises ``Forbidden`` (an upload is written aside and recorded only
    after its last read, so nothing of it stays)."""

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._claimed = request.headers.get(DIGEST_HEADER, EMPTY_DIGEST)
        self._hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self._request.read(size)
        self._hash.update(chunk)
        if not chunk or size < 0:
            if not hmac.compare_digest(self._hash.hexdigest(), self._claimed):
                raise Forbidden("the body is not the one the machine signed", field="body")
        return chunk


def signed_body(request: HttpRequest) -> SignedBody:
    return SignedBody(request)


def principal_header(principal: Principal) -> str:
    """Who an act is made for, as the holder rebuilds it (``principal_of``)."""
    return json.dumps({"user": principal.user.pk, "via": str(principal.via),
                       "token": principal.token.pk if principal.token else None,
                       "device": principal.device.pk if principal.device else None,
                       "task": principal.task.pk if principal.task is not None else None, "run": principal.run},
                      separators=(",", ":"))


def principal_of(request: HttpRequest) -> Principal:
    """The principal a verified act is made for (``principal_header``)."""
    try:
        who = json.loads(request.headers.get(PRINCIPAL_HEADER, ""))
        user = User.objects.get(pk=who["user"])
        token = ApiToken.objects.get(pk=who["token"]) if who.get("token") is not None else None
        device = Device.objects.get(pk=who["device"]) if who.get("device") is not None else None
        task = Task.objects.get(pk=who["task"]) if who.get("task") is not None else None
        return Principal(user, Via(who["via"]), token=token, device=device, task=task, run=who.get("run"))
    except (ValueError, KeyError, TypeError, User.DoesNotExist, ApiToken.DoesNotExist, Device.DoesNotExist,
            Task.DoesNotExist) as exc:
        raise Forbidden("the act names no principal of this box", field=None) from exc


def _open(machine: str, full_path: str, timeout: float, *, method: str = "GET", who: str = "",
          body: bytes | IO[bytes] = b"", digest: str | None = None, headers: dict[str, str] | None = None) -> Any:
    """``digest``: the SHA-256 of a body given as a file (bytes are hashed here)."""
    url = homes.url_of(machine)
    if not url:
        raise MachineUnreachable(f"machine '{machine}' has never said where it answers", field="machine")
    if digest is None:
        assert isinstance(body, bytes), "a body given as a file comes with its digest"
        digest = hashlib.sha256(body).hexdigest()
    sent = {HEADER: sign(method, full_path, who, digest), DIGEST_HEADER: digest, **(headers or {})}
    if who:
        sent[PRINCIPAL_HEADER] = who
    request = urllib.request.Request(url + full_path, data=body, method=method, headers=sent)
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - the box's own machine, http(s) only
    except urllib.error.HTTPError as answer:
        return answer  # the holder's own answer, in the error shape: passed on as it is
    except OSError as exc:
        raise MachineUnreachable(f"machine '{machine}', which holds this, does not answer: {exc}",
                                 field="machine") from exc


def internal_path(public_path: str, query: str = "") -> str:
    """The holder's internal path for a public API path (``/api/...``)."""
    rest = public_path.removeprefix("/api")
    return f"{PREFIX}{rest}" + (f"?{query}" if query else "")


def read_json(machine: str, full_path: str) -> Any:
    """The holder's JSON answer to an internal GET; its error (in the API's shape) is raised as one here."""
    with _open(machine, full_path, TIMEOUT_S) as answer:
        return _json_answer(machine, answer.read(), answer.status)


def act(machine: str, method: str, full_path: str, principal: Principal, body: bytes | IO[bytes] = b"",
        headers: dict[str, str] | None = None, *, digest: str | None = None) -> Any:
    """The holder makes an act on its own disk as ``principal`` (undo, Keep, an upload); its JSON
    answer, or its error raised here as the same error. ``digest``: as for ``_open``."""
    with _open(machine, full_path, TIMEOUT_S, method=method, who=principal_header(principal), body=body, digest=digest,
               headers={"Content-Type": "application/json", **(headers or {})}) as answer:
        return _json_answer(machine, answer.read(), answer.status)


def _json_answer(machine: str, body: bytes, status: int) -> Any:
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise MachineUnreachable(f"machine '{machine}' answered something that is not JSON", field="machine") from exc
    if status >= 400:
        error = BoxError(str(parsed.get("message", "")), field=parsed.get("field"), code=str(parsed.get("code", "")))
        error.status = status
        raise error
    return parsed


def relay(machine: str, request: HttpRequest) -> HttpResponseBase:
    """The holder's answer to the same read, streamed through (a file, an artifact)."""
    full_path = internal_path(request.path, request.META.get("QUERY_STRING", ""))
    answer = _open(machine, full_path, TIMEOUT_S)

    def chunks() -> Iterator[bytes]:
        with answer:
            while chunk := answer.read(1 << 16):
                yield chunk

    response = StreamingHttpResponse(chunks(), status=answer.status)
    for name in KEPT_HEADERS:
        if answer.headers.get(name) is not None:
            response[name] = answer.headers[name]
    return response


def open_stream(machine: str, full_path: str, timeout: float) -> Any:
    """An internal GET's answer as a file-like object (a workspace's export); an error answer raises."""
    answer = _open(machine, full_path, timeout)
    if answer.status >= 400:
        body = answer.read()[:500]
        answer.close()
        raise MachineUnreachable(f"machine '{machine}' refused {full_path}: {answer.status} {body!r}", field="machine")
    return answer
