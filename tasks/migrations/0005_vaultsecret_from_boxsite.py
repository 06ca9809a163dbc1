"""VaultSecret moves here from the boxsite app. The table ``boxsite_vaultsecret`` and its rows stay
as they are: this migration only tells Django that the tasks app now owns it."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("tasks", "0004_event_kind_step_result"),
        ("boxsite", "0002_vaultsecret_moves_to_tasks"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="VaultSecret",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=128, unique=True)),
                        ("ciphertext", models.BinaryField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                    ],
                    options={"db_table": "boxsite_vaultsecret"},
                ),
            ],
            database_operations=[],
        ),
    ]
