"""The account API: settings, API tokens, paired devices, pairing and Web Push subscriptions. Each view checks input,
calls one service in ``boxsite.services`` and presents the result."""
from __future__ import annotations

from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import push
from approvals.actions import actions_today
from boxsite import services
from boxsite.core.auth import DEVICE_COOKIE
from boxsite.core.hostnames import as_host, is_loopback, listens_wide, own_addresses
from boxsite.core.principal import Principal
from boxsite.core.qr import qr_svg
from boxsite.core.shapes import DateTime, Doc, shape
from boxsite.models import ApiToken, BoxSettings, Device, PushSubscription
from tasks import notify

DEVICE_COOKIE_AGE = 400 * 24 * 3600  # browsers cap cookie lifetimes at about 400 days


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class SettingsView(TypedDict):
    defaultBudgetCents: int
    networkDefault: str
    defaultHosts: list[str]
    retentionDays: int
    retentionCount: Annotated[int, Doc("ended tasks whose history is kept (newest first)")]
    maxActiveTasks: int
    taskMemoryMb: Annotated[int, Doc("a new task's memory limit (MB) when its spec sets none")]
    taskCpuPercent: Annotated[int, Doc("a new task's CPU cap (% of one core) when its spec sets none")]
    taskDiskMb: Annotated[int, Doc("what a new task may write to its layer (MB) when its spec sets none")]
    tasksMayCreateWork: Annotated[bool, Doc("a running task may create child tasks and schedules through its broker")]
    maxCreatedPerTask: Annotated[int, Doc("the most tasks and schedules one task may create")]
    timeZone: Annotated[str, Doc("the owner's calendar (an IANA name), for the daily action count")]
    maxActionsPerDay: Annotated[int | None, Doc("reaching it tells the owner once a day; null: no maximum")]
    actionsToday: Annotated[int, Doc("consequential actions attempted today, in timeZone")]
    notifyUrls: Annotated[list[str], Doc("Settings → Notifications' Apprise URLs, their tokens masked")]
    notifyUrlsFromEnvironment: Annotated[list[str], Doc("BOX_NOTIFY_URLS' Apprise URLs (masked), told as well")]
    updatedAt: DateTime | None


class TokenView(TypedDict):
    id: int
    name: str
    prefix: str
    canUseFolders: bool
    createdAt: DateTime | None
    lastUsedAt: DateTime | None
    revokedAt: DateTime | None


class NewToken(TokenView):
    token: Annotated[str, Doc("the token itself: shown this once")]


class TokenPage(TypedDict):
    results: list[TokenView]


class DeviceView(TypedDict):
    id: int
    name: str
    createdAt: DateTime | None
    lastSeenAt: DateTime | None
    revokedAt: DateTime | None


class DevicePage(TypedDict):
    results: list[DeviceView]


class Pairing(TypedDict):
    code: str
    url: str
    expiresAt: DateTime | None
    qrSvg: str
    reachWarning: Annotated[str | None, Doc("why a phone could not open the link, and the fix; null when it can")]


class PushKey(TypedDict):
    publicKey: Annotated[str, Doc("the box's VAPID public key: PushManager.subscribe's applicationServerKey (base64url)")]


class PushSubscriptionView(TypedDict):
    id: int
    device: Annotated[int | None, Doc("the paired phone it belongs to; null: the owner's signed-in browser")]
    deviceName: str | None
    endpointHost: Annotated[str, Doc("the push service's host (the endpoint itself is the browser's capability)")]
    createdAt: DateTime | None
    lastSentAt: DateTime | None


class PushSubscriptionPage(TypedDict):
    results: list[PushSubscriptionView]


def present_settings(row: BoxSettings) -> SettingsView:
    return {
        "defaultBudgetCents": row.default_budget_cents,
        "networkDefault": row.network_default,
        "defaultHosts": row.default_hosts,
        "retentionDays": row.retention_days,
        "retentionCount": row.retention_count,
        "maxActiveTasks": row.max_active_tasks,
        "taskMemoryMb": row.resource_default("memory_mb"),
        "taskCpuPercent": row.resource_default("cpu_percent"),
        "taskDiskMb": row.resource_default("disk_mb"),
        "tasksMayCreateWork": row.tasks_may_create_work,
        "maxCreatedPerTask": row.max_created_per_task,
        "timeZone": row.time_zone,
        "maxActionsPerDay": row.max_actions_per_day,
        "actionsToday": actions_today(row),
        "notifyUrls": [notify.masked(url) for url in notify.stored_urls()],
        "notifyUrlsFromEnvironment": [notify.masked(url) for url in notify.environment_urls()],
        "updatedAt": _iso(row.updated_at),
    }


def present_token(token: ApiToken) -> TokenView:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "canUseFolders": token.can_use_folders,
        "createdAt": _iso(token.created_at),
        "lastUsedAt": _iso(token.last_used_at),
        "revokedAt": _iso(token.revoked_at),
    }


def present_device(device: Device) -> DeviceView:
    return {
        "id": device.pk,
        "name": device.name,
        "createdAt": _iso(device.created_at),
        "lastSeenAt": _iso(device.last_seen_at),
        "revokedAt": _iso(device.revoked_at),
    }


@extend_schema(methods=["GET"], responses={200: shape(SettingsView)})
@extend_schema(methods=["PATCH"], request=services.SettingsBody, responses={200: shape(SettingsView)})
@api_view(["GET", "PATCH"])
def box_settings(request: Request) -> Response:
    principal = Principal.of(request)
    if request.method == "PATCH":
        return Response(present_settings(services.update_settings(principal, request.data)))
    services.require_settings_right(principal)
    return Response(present_settings(BoxSettings.current()))


@extend_schema(methods=["GET"], responses={200: shape(TokenPage)})
@extend_schema(methods=["POST"], request=services.TokenBody, responses={201: shape(NewToken)})
@api_view(["GET", "POST"])
def tokens(request: Request) -> Response:
    principal = Principal.of(request)
    if request.method == "POST":
        token, raw = services.create_token(principal, request.data)
        created: NewToken = {**present_token(token), "token": raw}  # the only time the value is ever shown
        return Response(created, status=201)
    services.require_settings_right(principal)
    rows = ApiToken.objects.filter(user=principal.user).order_by("-created_at", "-pk")
    listed: TokenPage = {"results": [present_token(t) for t in rows]}
    return Response(listed)


@extend_schema(request=None, responses={200: shape(TokenView)})
@api_view(["DELETE"])
def token_delete(request: Request, token_id: int) -> Response:
    """Revoke the token (the row stays, revoked, in the list)."""
    return Response(present_token(services.revoke_token(Principal.of(request), token_id)))


@extend_schema(request=None, responses={200: shape(TokenView)})
@api_view(["POST"])
def token_revoke(request: Request, token_id: int) -> Response:
    return Response(present_token(services.revoke_token(Principal.of(request), token_id)))


@extend_schema(responses={200: shape(DevicePage)})
@api_view(["GET"])
def devices(request: Request) -> Response:
    principal = Principal.of(request)
    services.require_settings_right(principal)
    rows = Device.objects.filter(user=principal.user).order_by("-created_at", "-pk")
    listed: DevicePage = {"results": [present_device(d) for d in rows]}
    return Response(listed)


@extend_schema(request=None, responses={200: shape(DeviceView)})
@api_view(["DELETE"])
def device_delete(request: Request, device_id: int) -> Response:
    """Revoke the device (the row stays, revoked, in the list)."""
    return Response(present_device(services.revoke_device(Principal.of(request), device_id)))


@extend_schema(request=None, responses={200: shape(DeviceView)})
@api_view(["POST"])
def device_revoke(request: Request, device_id: int) -> Response:
    return Response(present_device(services.revoke_device(Principal.of(request), device_id)))


def present_subscription(row: PushSubscription) -> PushSubscriptionView:
    return {
        "id": row.pk,
        "device": row.device_id,
        "deviceName": row.device.name if row.device else None,
        "endpointHost": urlsplit(row.endpoint).hostname or "",
        "createdAt": _iso(row.created_at),
        "lastSentAt": _iso(row.last_sent_at),
    }


@extend_schema(responses={200: shape(PushKey)})
@api_view(["GET"])
def push_key(request: Request) -> Response:
    """The box's VAPID public key, generated on first use, for a browser subscribing to Web Push."""
    Principal.of(request)
    key: PushKey = {"publicKey": push.public_key()}
    return Response(key)


@extend_schema(methods=["GET"], responses={200: shape(PushSubscriptionPage)})
@extend_schema(methods=["POST"], request=services.PushSubscriptionBody,
               responses={200: shape(PushSubscriptionView), 201: shape(PushSubscriptionView)})
@api_view(["GET", "POST"])
def push_subscriptions(request: Request) -> Response:
    """Register this browser's push subscription (a paired phone's or the owner's browser's):
    the box's notices then reach it as Web Push. 201 when new, 200 when it updated one."""
    principal = Principal.of(request)
    if request.method == "POST":
        row, created = services.subscribe_push(principal, request.data)
        return Response(present_subscription(row), status=201 if created else 200)
    listed: PushSubscriptionPage = {"results": [present_subscription(r) for r in services.push_subscriptions_for(principal)]}
    return Response(listed)


@extend_schema(request=None, responses={204: None})
@api_view(["DELETE"])
def push_subscription_delete(request: Request, subscription_id: int) -> Response:
    """Stop Web Push to one subscription (a phone may stop only its own)."""
    services.unsubscribe_push(Principal.of(request), subscription_id)
    return Response(status=204)


def pairing_url(request: HttpRequest, code: str) -> str:
    """Where the QR code leads: the public URL when one is set, else the address asked for; but
    when that names this machine's loopback and the box listens wider, the address a phone on the
    network reaches (the one the box is bound to, or this machine's first own address)."""
    if settings.BOX_PUBLIC_URL:
        return f"{settings.BOX_PUBLIC_URL}/pair?code={code}"
    if is_loopback(split_domain_port(request.get_host())[0]) and listens_wide(settings.BOX_HOST):
        bound = settings.BOX_HOST.strip("[]")
        addresses = [bound] if bound not in ("0.0.0.0", "::") else own_addresses()
        if addresses:
            port = request.get_port()
            default = {"http": "80", "https": "443"}.get(request.scheme or "")
            netloc = as_host(addresses[0]) + ("" if port == default else f":{port}")
            return f"{request.scheme}://{netloc}/pair?code={code}"
    return request.build_absolute_uri(f"/pair?code={code}")


def phone_reach_warning(url: str) -> str | None:
    """Why a phone could not open ``url`` (the box listens on loopback only, or the link names
    this machine's loopback), and how to fix it; None when it can."""
    if settings.BOX_PUBLIC_URL:
        return None
    link_host = urlsplit(url).hostname or ""
    if is_loopback(settings.BOX_HOST):
        where = f"The box listens on {settings.BOX_HOST} only"
    elif is_loopback(link_host):
        where = f"This page was opened as {link_host}, so the QR code leads there"
    else:
        return None
    return (f"{where}: a phone cannot reach it. Start the box with BOX_HOST=0.0.0.0 (or this machine's "
            "address on your network) and open this page by that address, or set BOX_PUBLIC_URL to the "
            "address phones should use (a tunnel or reverse proxy); the QR code and links then use it.")


@extend_schema(request=None, responses={201: shape(Pairing)})
@api_view(["POST"])
def pairing_start(request: Request) -> Response:
    """A one-time code (and its QR code) that pairs one phone within ten minutes."""
    row, code = services.start_pairing(Principal.of(request))
    url = pairing_url(request, code)
    body: Pairing = {"code": code, "url": url, "expiresAt": _iso(row.expires_at),
                      "qrSvg": qr_svg(url, label=f"QR code to pair a phone, code {code}"),
                      "reachWarning": phone_reach_warning(url)}
    return Response(body, status=201)


@extend_schema(request=services.PairingClaimBody, responses={201: shape(DeviceView)})
@api_view(["POST"])
@permission_classes([AllowAny])
def pairing_claim(request: Request) -> Response:
    """Spend a pairing code: the phone gets its device key as an HttpOnly cookie, never in the body."""
    body = services.PairingClaimBody.parse(request.data)
    device, key = services.pair_device(body["code"], body.get("name") or "Phone")
    response = Response(present_device(device), status=201)
    set_device_cookie(response, request, key)
    return response


def set_device_cookie(response: HttpResponse, request: HttpRequest, key: str) -> None:
    response.set_cookie(
        DEVICE_COOKIE, key, max_age=DEVICE_COOKIE_AGE, httponly=True, samesite="Lax",
        secure=request.is_secure() or settings.SECURE_COOKIES,
    )
