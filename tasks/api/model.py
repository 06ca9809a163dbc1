"""Settings → Model over the API: read and change the model configuration, test the connection."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core.errors import Forbidden
from boxsite.core.principal import Principal
from boxsite.core.shapes import shape
from boxsite.core.validation import AnyNumber, AnyText, Body
from tasks.llm import client as model
from tasks.llm import probe
from tasks.spec.describe import Describe, guide


class ModelSettingsBody(Body):
    """``PATCH /api/model``: any of the model settings. ``tasks.llm.client.update_settings`` checks
    the values."""

    what = "model settings"
    baseUrl = AnyText(required=False, help_text="the chat-completions endpoint's base URL")
    model = AnyText(required=False, help_text="the model's name at that endpoint")
    keyName = AnyText(required=False, help_text="the vault secret holding the API key")
    key = AnyText(required=False, help_text="stored in the vault under keyName; never returned")
    inputCentsPerMillion = AnyNumber(required=False)
    outputCentsPerMillion = AnyNumber(required=False)
    cachedInputCentsPerMillion = AnyNumber(required=False, help_text="the price of cached input tokens; null: the input price")
    reasoningEffort = AnyText(required=False, help_text="low, medium or high, sent as reasoning_effort; null: not sent")
    contextTokens = AnyNumber(required=False, help_text="the model's context window in tokens; null: BOX_MODEL_CONTEXT_TOKENS")


def _require_settings_right(request: Request) -> None:
    if not Principal.of(request).can_change_settings:
        raise Forbidden("only the owner (browser or API token) configures the model")


@extend_schema(methods=["GET"], responses={200: shape(model.ModelSettings)})
@extend_schema(methods=["PATCH"], request=ModelSettingsBody, responses={200: shape(model.ModelSettings)})
@api_view(["GET", "PATCH"])
def model_settings(request: Request) -> Response:
    _require_settings_right(request)
    if request.method == "PATCH":
        model.update_settings(ModelSettingsBody.parse(request.data))
    return Response(model.present_settings())


@extend_schema(responses={200: shape(Describe)})
@api_view(["GET"])
def describe(request: Request) -> Response:
    """The guide to writing flows: the language, each step kind's schema, worked examples."""
    return Response(guide())


@extend_schema(request=None, responses={200: shape(probe.ModelTest)})
@api_view(["POST"])
def model_test(request: Request) -> Response:
    """One short call to the configured model; what it answered (or why it could not)."""
    _require_settings_right(request)
    try:
        config = model.current_config()
    except model.NoModel as exc:
        return Response({"ok": False, "error": str(exc), "kind": "config"})
    return Response(probe.check_connection(config))
