from django.urls import path

from tasks.api import views
from tasks.api import workspaces as workspace_views

urlpatterns = [
    path("tasks", views.task_list, name="task-list"),
    path("tasks/<str:task_id>", views.task_detail, name="task-detail"),
    path("tasks/<str:task_id>/events", views.task_events, name="task-events"),
    path("tasks/<str:task_id>/cancel", views.task_cancel, name="task-cancel"),
    path("tasks/<str:task_id>/undo", views.task_undo, name="task-undo"),
    path("tasks/<str:task_id>/diff", workspace_views.task_diff, name="task-diff"),
    path("tasks/<str:task_id>/keep", workspace_views.task_keep, name="task-keep"),
    path("workspaces", workspace_views.workspace_list, name="workspace-list"),
    path("workspaces/<str:name>", workspace_views.workspace_detail, name="workspace-detail"),
    path("workspaces/<str:name>/move", workspace_views.workspace_move, name="workspace-move"),
    path("workspaces/<str:name>/abandon", workspace_views.workspace_abandon, name="workspace-abandon"),
    path("workspaces/<str:name>/files", workspace_views.workspace_files, name="workspace-files"),
    path("workspaces/<str:name>/files/<path:path>", workspace_views.workspace_file, name="workspace-file"),
    path("tasks/<str:task_id>/report", views.task_report, name="task-report"),
    path("tasks/<str:task_id>/rerun", views.task_rerun, name="task-rerun"),
    path("tasks/<str:task_id>/retry", views.task_retry, name="task-retry"),
    path("tasks/<str:task_id>/runs", views.task_runs, name="task-runs"),
    path("tasks/<str:task_id>/dependencies", views.task_dependencies, name="task-dependencies"),
    path("tasks/<str:task_id>/artifacts/<path:name>", views.task_artifact, name="task-artifact"),
]
