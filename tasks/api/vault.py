"""The vault API (set, list names, delete; values are never returned) and the tool list."""
from __future__ import annotations

from typing import Annotated, Any, TypedDict

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core.errors import Forbidden
from boxsite.core.principal import Principal
from boxsite.core.shapes import DateTime, Doc, shape
from boxsite.core.validation import AnyText, Body
from tasks.models import VaultSecret
from tasks.tools.registry import all_tools
from tasks.vault import store as vault


def _require_settings_right(request: Request) -> None:
    if not Principal.of(request).can_change_settings:
        raise Forbidden("only the owner (browser or API token) manages the vault")


class SecretBody(Body):
    """``POST /api/vault``: set (or replace) one secret. ``tasks.vault.store.set_secret`` checks both."""

    name = AnyText(help_text="letters, digits and _ (not starting with a digit), at most 128")
    value = AnyText(help_text="write-only: never shown again")


class Secret(TypedDict):
    name: str
    createdAt: DateTime
    updatedAt: DateTime


class SecretList(TypedDict):
    secrets: list[Secret]


class Tool(TypedDict):
    name: str
    description: str
    schema: Annotated[dict[str, Any], Doc("a JSON Schema of the tool's arguments")]
    costCents: int
    irreversible: bool
    provider: str


class ToolList(TypedDict):
    tools: list[Tool]


def present_secret(row: VaultSecret) -> Secret:
    # Deliberately no value and no ciphertext: a secret is write-only once set.
    return {"name": row.name, "createdAt": row.created_at.isoformat(), "updatedAt": row.updated_at.isoformat()}


@extend_schema(methods=["GET"], responses={200: shape(SecretList)})
@extend_schema(methods=["POST"], request=SecretBody, responses={201: shape(Secret), 200: shape(Secret)})
@api_view(["GET", "POST"])
def vault_list(request: Request) -> Response:
    _require_settings_right(request)
    if request.method == "POST":
        body = SecretBody.parse(request.data)
        existed = VaultSecret.objects.filter(name=body.get("name")).exists()
        row = vault.set_secret(body.get("name"), body.get("value"))
        return Response(present_secret(row), status=200 if existed else 201)
    listed: SecretList = {"secrets": [present_secret(row) for row in VaultSecret.objects.order_by("name")]}
    return Response(listed)


@extend_schema(request=None, responses={204: None})
@api_view(["DELETE"])
def vault_detail(request: Request, name: str) -> Response:
    _require_settings_right(request)
    vault.delete_secret(name)
    return Response(status=204)


@extend_schema(responses={200: shape(ToolList)})
@api_view(["GET"])
def tool_list(request: Request) -> Response:
    """The tools a task may list in its spec: built in, from apps, and the owner's command tools."""

    listed: ToolList = {"tools": [
        {"name": t.name, "description": t.description, "schema": t.schema, "costCents": t.cost_cents,
         "irreversible": t.irreversible, "provider": t.provider}
        for t in all_tools()
    ]}
    return Response(listed)
