from django.urls import path

from tasks.api import browser_cache
from tasks.api import model as model_views
from tasks.api import vault as vault_views

urlpatterns = [
    path("vault", vault_views.vault_list, name="vault-list"),
    path("vault/<str:name>", vault_views.vault_detail, name="vault-detail"),
    path("tools", vault_views.tool_list, name="tool-list"),
    path("settings/model", model_views.model_settings, name="model-settings"),
    path("settings/model/test", model_views.model_test, name="model-test"),
    path("describe", model_views.describe, name="describe"),
    path("browser/cache", browser_cache.cache_list, name="browser-cache"),
    path("browser/cache/<str:entry_id>", browser_cache.cache_entry, name="browser-cache-entry"),
]
