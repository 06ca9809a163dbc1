from django.db import migrations


def mark_applied_layers_sealed(apps, schema_editor):
    # Which layers are sealed is written in their meta files, which a migration does not read.
    # An applied layer is marked sealed: before this field, every layer in a stack was sealed
    # (or its seal waited for) by the start that stacked it, and a start still seals every layer
    # it stacks, so a layer marked sealed that is not is stacked and sealed as before. Only a
    # layer marked unsealed can be left out of a concurrent task's stack, and none is.
    Layer = apps.get_model("tasks", "Layer")
    Layer.objects.filter(state="applied").update(sealed=True)


class Migration(migrations.Migration):
    dependencies = [("tasks", "0013_layer_sealed")]
    operations = [migrations.RunPython(mark_applied_layers_sealed, migrations.RunPython.noop)]
