from django.urls import include, path, re_path
from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiJsonRenderer2, OpenApiYamlRenderer
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from boxsite import metrics, views
from boxsite.core import schema
from boxsite.mcp import server as mcp

urlpatterns = [
    path("api/health", views.health, name="health"),
    # Prometheus text, not JSON: no API operation, so not in the schema (boxsite.metrics).
    path("metrics", metrics.metrics, name="metrics"),
    # JSON first: the schema (and an error from its view) is JSON unless YAML is asked for; a
    # client asking for plain application/json gets it too.
    path("api/schema/", SpectacularAPIView.as_view(
        renderer_classes=[OpenApiJsonRenderer, OpenApiJsonRenderer2, OpenApiYamlRenderer]), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("tasks.api.urls")),
    # Several machines: what one asks another, signed with the shared secret (tasks.api.machine_views).
    path("internal/machine/", include("tasks.api.machine_urls")),
    path("api/", include("tasks.api.vault_urls")),
    path("api/", include("approvals.urls")),
    path("api/", include("schedules.urls")),
    path("", include("schedules.hook_urls")),
    path("api/", include("boxsite.account_urls")),
    re_path(r"^mcp/?$", mcp.endpoint, name="mcp"),  # the Model Context Protocol (boxsite.mcp)
    path("", include("boxsite.page_urls")),
]

# The schema's authentication extensions register when their module is imported.
SCHEMA_EXTENSIONS = (schema.BearerAuth, schema.DeviceCookieAuth)

handler400 = views.bad_request
handler403 = views.permission_denied
handler404 = views.api_not_found
handler500 = views.server_error
