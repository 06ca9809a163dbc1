from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0012_layer_note_due'),
    ]

    operations = [
        migrations.AddField(
            model_name='layer',
            name='sealed',
            field=models.BooleanField(default=False),
        ),
    ]
