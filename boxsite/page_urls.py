"""Routes of the portal and phone pages (mounted at the root by boxsite.urls)."""
from django.contrib.auth.views import LogoutView
from django.urls import path

from boxsite import pages, schedule_pages

urlpatterns = [
    path("", pages.home, name="home"),
    path("setup", pages.setup, name="setup"),
    path("login", pages.SignIn.as_view(), name="login"),
    path("logout", LogoutView.as_view(next_page="/login"), name="logout"),
    path("tasks", pages.tasks, name="tasks"),
    path("tasks/<str:task_id>", pages.task_window, name="task"),
    path("workspaces/<str:name>", pages.workspace_page, name="workspace"),
    path("inbox", pages.inbox, name="inbox"),
    path("settings", pages.settings_page, name="settings-page"),
    path("schedules", schedule_pages.schedules_page, name="schedules-page"),
    path("triggers", schedule_pages.triggers_page, name="triggers-page"),
    path("ask", pages.ask, name="ask"),
    path("pair", pages.pair, name="pair"),
    path("manifest.webmanifest", pages.manifest, name="manifest"),
    path("sw.js", pages.service_worker, name="service-worker"),
    path("approval-links/<str:token>", pages.approval_link, name="approval-link-page"),
]
