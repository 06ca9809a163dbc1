import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "boxsite.settings")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

application = ProtocolTypeRouter({"http": django_app})
