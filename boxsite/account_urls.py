"""Routes of the account API (mounted under /api/ by boxsite.urls)."""
from django.urls import path

from boxsite import account_views as views

urlpatterns = [
    path("settings", views.box_settings, name="settings"),
    path("tokens", views.tokens, name="token-list"),
    path("tokens/<int:token_id>", views.token_delete, name="token-delete"),
    path("tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("devices", views.devices, name="device-list"),
    path("devices/<int:device_id>", views.device_delete, name="device-delete"),
    path("devices/<int:device_id>/revoke", views.device_revoke, name="device-revoke"),
    path("push/key", views.push_key, name="push-key"),
    path("push/subscriptions", views.push_subscriptions, name="push-subscriptions"),
    path("push/subscriptions/<int:subscription_id>", views.push_subscription_delete, name="push-subscription-delete"),
    path("pairing", views.pairing_start, name="pairing-start"),
    path("pairing/claim", views.pairing_claim, name="pairing-claim"),
]
