from django.apps import AppConfig


class BoxsiteConfig(AppConfig):
    """Site-wide concerns of the box: who may call it (tokens, devices) and its settings."""

    name = "boxsite"
    default_auto_field = "django.db.models.BigAutoField"
