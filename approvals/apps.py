from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # tasks reaches approvals only through what it declares (tasks.pauses, the sections of a
        # task's view): this app, above it, fills them in once the apps are loaded.
        from approvals import actions, blockers, presenters, push  # noqa: PLC0415 - they import models
        from tasks import notify, pauses  # noqa: PLC0415 - they import models

        pauses.install(blockers=blockers, actions=actions)
        presenters.add_task_sections()
        notify.install_channel(push.CHANNEL)
