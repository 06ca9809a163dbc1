from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0011_task_provenance_recovery_edges'),
    ]

    operations = [
        migrations.AddField(
            model_name='layer',
            name='note_due',
            field=models.BooleanField(default=False),
        ),
        migrations.AddIndex(
            model_name='layer',
            index=models.Index(condition=models.Q(note_due=True), fields=['note_due'], name='layer_note_due'),
        ),
    ]
