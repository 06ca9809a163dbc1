from django.urls import path

from tasks import views

urlpatterns = [
    path("tasks", views.task_list, name="task-list"),
    path("tasks/<str:task_id>", views.task_detail, name="task-detail"),
    path("tasks/<str:task_id>/events", views.task_events, name="task-events"),
    path("tasks/<str:task_id>/cancel", views.task_cancel, name="task-cancel"),
    path("tasks/<str:task_id>/undo", views.task_undo, name="task-undo"),
    path("tasks/<str:task_id>/continue", views.task_continue, name="task-continue"),
    path("tasks/<str:task_id>/report", views.task_report, name="task-report"),
]
