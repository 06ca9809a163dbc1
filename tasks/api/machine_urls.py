"""The machines' own endpoints (``tasks.api.machine_views``), under ``/internal/machine/``."""
from django.urls import path

from tasks.api import machine_views

urlpatterns = [
    path("tasks/<str:task_id>/diff", machine_views.task_diff, name="machine-task-diff"),
    path("tasks/<str:task_id>/artifacts/<path:name>", machine_views.task_artifact, name="machine-task-artifact"),
    path("workspaces/<str:name>/files", machine_views.workspace_files, name="machine-workspace-files"),
    path("workspaces/<str:name>/files/<path:path>", machine_views.workspace_file_write, name="machine-workspace-file"),
    path("tasks/<str:task_id>/undo", machine_views.task_undo, name="machine-task-undo"),
    path("tasks/<str:task_id>/keep", machine_views.task_keep, name="machine-task-keep"),
    path("workspaces/<str:name>/export", machine_views.workspace_export, name="machine-workspace-export"),
]
