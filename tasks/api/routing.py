"""WebSocket routes of the tasks app (mounted by boxsite.asgi)."""
from __future__ import annotations

from django.urls import re_path

from tasks.api.browser_view import BrowserViewConsumer
from tasks.api.consumers import TaskEventsConsumer, TaskListConsumer

websocket_urlpatterns = [
    re_path(r"^ws/tasks/$", TaskListConsumer.as_asgi()),
    re_path(r"^ws/tasks/(?P<task_id>[A-Za-z0-9]{1,24})/$", TaskEventsConsumer.as_asgi()),
    re_path(r"^ws/tasks/(?P<task_id>[A-Za-z0-9]{1,24})/browser/$", BrowserViewConsumer.as_asgi()),
]
