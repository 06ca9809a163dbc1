from django.db import migrations


def create_home(apps, schema_editor):
    Workspace = apps.get_model("tasks", "Workspace")
    # A relative base_dir lives under BOX_DATA_DIR/workspaces, so the data dir can move.
    Workspace.objects.get_or_create(name="home", defaults={"base_dir": "home"})


class Migration(migrations.Migration):
    dependencies = [("tasks", "0001_initial")]
    operations = [migrations.RunPython(create_home, migrations.RunPython.noop)]
