from django.urls import path

from schedules import views

# Under /api/ (the owner's API, authenticated like every other API call).
urlpatterns = [
    path("schedules", views.schedule_list, name="schedule-list"),
    path("schedules/<str:schedule_id>", views.schedule_detail, name="schedule-detail"),
    path("schedules/<str:schedule_id>/pause", views.schedule_pause, name="schedule-pause"),
    path("schedules/<str:schedule_id>/run", views.schedule_run, name="schedule-run"),
    path("schedules/<str:schedule_id>/resume", views.schedule_resume, name="schedule-resume"),
    path("schedules/<str:schedule_id>/firings", views.schedule_firings, name="schedule-firings"),
    path("triggers", views.trigger_list, name="trigger-list"),
    path("triggers/<str:trigger_id>", views.trigger_detail, name="trigger-detail"),
    path("triggers/<str:trigger_id>/pause", views.trigger_pause, name="trigger-pause"),
    path("triggers/<str:trigger_id>/resume", views.trigger_resume, name="trigger-resume"),
    path("triggers/<str:trigger_id>/rotate", views.trigger_rotate, name="trigger-rotate"),
    path("triggers/<str:trigger_id>/test", views.trigger_test, name="trigger-test"),
    path("triggers/<str:trigger_id>/deliveries", views.trigger_deliveries, name="trigger-deliveries"),
    path("triggers/<str:trigger_id>/rotate/finish", views.trigger_finish_rotation, name="trigger-finish-rotation"),
]
