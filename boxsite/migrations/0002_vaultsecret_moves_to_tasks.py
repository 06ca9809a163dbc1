"""VaultSecret now belongs to the tasks app (next to the vault code). Only Django's picture of the
models changes here; the table and its rows stay where they are (tasks 0005 adopts it)."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("boxsite", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="VaultSecret")],
            database_operations=[],
        ),
    ]
