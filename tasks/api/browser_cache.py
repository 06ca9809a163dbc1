"""The grounding cache API (``tasks.browser.cache``): the owner lists what describe targets the
box remembers, and clears them (all, one workspace's, or one entry)."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core.errors import InvalidRequest
from boxsite.core.pagination import Sort, limit_param, page
from boxsite.core.principal import Principal
from boxsite.core.shapes import shape
from tasks.browser import cache

SORTS = {"-grounded": Sort("-grounded", "grounded_at", descending=True)}
WORKSPACE = OpenApiParameter("workspace", str, description="only this workspace's entries")


@extend_schema(methods=["GET"], operation_id="browser_cache_list",
               parameters=[WORKSPACE, OpenApiParameter("cursor", str), OpenApiParameter("limit", int)],
               description="The caller's live entries, newest first.", responses={200: shape(cache.GroundingPage)})
@extend_schema(methods=["DELETE"], operation_id="browser_cache_clear", parameters=[WORKSPACE], request=None,
               description="Remove the caller's entries (of one workspace with `workspace`): the next run of each "
                           "instruction asks the model again.", responses={200: shape(cache.Cleared)})
@api_view(["GET", "DELETE"])
def cache_list(request: Request) -> Response:
    principal = Principal.of(request)
    workspace = request.query_params.get("workspace")
    if request.method == "DELETE":
        cleared: cache.Cleared = {"cleared": cache.clear(principal, workspace)}
        return Response(cleared)
    rows, next_cursor = page(cache.entries_for(principal, workspace), SORTS, "-grounded",
                             request.query_params.get("cursor"), limit_param(request.query_params.get("limit")))
    listed: cache.GroundingPage = {"results": [cache.present_entry(e) for e in rows], "next": next_cursor}
    return Response(listed)


@extend_schema(request=None, responses={204: None})
@api_view(["DELETE"])
def cache_entry(request: Request, entry_id: str) -> Response:
    if not entry_id.isdigit() or len(entry_id) > 18:
        raise InvalidRequest("an entry id is a whole number", field="entry_id")
    cache.forget(Principal.of(request), int(entry_id))
    return Response(status=204)
