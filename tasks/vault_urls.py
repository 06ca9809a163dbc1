from django.urls import path

from tasks import vault_views

urlpatterns = [
    path("vault", vault_views.vault_list, name="vault-list"),
    path("vault/<str:name>", vault_views.vault_detail, name="vault-detail"),
    path("tools", vault_views.tool_list, name="tool-list"),
]
