"""The ASGI entry point: HTTP through Django, WebSockets through Channels.

WebSocket connections are checked in layers: the Origin header against ALLOWED_HOSTS (a page on
another site cannot open a stream with the owner's cookies), then a program's bearer token, the
session and the paired device's cookie; the consumers refuse anyone none of them names.
"""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "boxsite.settings")
os.environ["BOX_WEB_PROCESS"] = "1"  # settings: each of its kept threads keeps its connection

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

# The portal's CSS/JS are a handful of small files served by the box itself (no CDN, no separate
# web server to set up); Django's static handler serves /static/ from the app's own directory.
get_asgi_application()  # django.setup()
from boxsite.core.handler import OneStepASGIHandler, StaticFilesHandler  # noqa: E402

django_app = StaticFilesHandler(OneStepASGIHandler())

from boxsite.core.ws_auth import BearerTokenMiddleware, DeviceCookieMiddleware, NulCookiesDropped  # noqa: E402
from tasks.api.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_app,
    "websocket": AllowedHostsOriginValidator(NulCookiesDropped(
        AuthMiddlewareStack(DeviceCookieMiddleware(BearerTokenMiddleware(URLRouter(websocket_urlpatterns)))))),
})
