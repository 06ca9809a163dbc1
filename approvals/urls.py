from django.urls import path

from approvals import views

urlpatterns = [
    path("tasks/<str:task_id>/continue", views.task_continue, name="task-continue"),
    path("tasks/<str:task_id>/actions", views.task_actions, name="task-actions"),
    path("inbox", views.inbox, name="inbox"),
    path("approvals/<str:approval_id>", views.approval_detail, name="approval-detail"),
    path("approvals/<str:approval_id>/approve", views.approval_approve, name="approval-approve"),
    path("approvals/<str:approval_id>/deny", views.approval_deny, name="approval-deny"),
    path("approval-links/<str:token>", views.approval_link, name="approval-link"),
    path("questions/<str:question_id>", views.question_detail, name="question-detail"),
    path("questions/<str:question_id>/answer", views.question_answer, name="question-answer"),
]
