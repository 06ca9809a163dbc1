from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The tool a task uses to create work (task.create; schedules adds schedule.create) needs the task
        # services, which need the registry: they are registered once the apps are loaded.
        from tasks.tools import delegation, registry  # noqa: PLC0415 - they import models: not before the registry is ready

        for tool in delegation.TOOLS:
            registry.register(tool)
