import atexit
import gc
import sys

from django.apps import AppConfig
from django.conf import settings


class BoxsiteConfig(AppConfig):
    """Site-wide concerns of the box: who may call it (tokens, devices) and its settings."""

    name = "boxsite"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # At exit, Python's last garbage collections walk every object a process made, and a
        # Django process holds very many: CPU spent before a stopped box process is gone.
        # Frozen objects are skipped by those collections; exit handlers still run, files
        # and connections are still closed. Registered first, so it runs after every other
        # exit handler (they run last-registered first).
        atexit.register(gc.freeze)
        sys.setswitchinterval(settings.BOX_GIL_SWITCH_MS / 1000)
