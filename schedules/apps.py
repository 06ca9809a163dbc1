from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "schedules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A running task may create schedules (box schedule, the schedule.create tool): tasks
        # declares how (tasks.tools.delegation), this app, above it, adds them.
        from schedules import delegation  # noqa: PLC0415 - it imports models

        delegation.add_to_tasks()
