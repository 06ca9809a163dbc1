"""Moving VaultSecret from the boxsite app to the tasks app keeps every stored secret."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tasks.vault import crypto
from tasks.vault import store as vault

BEFORE_THE_MOVE = [("boxsite", "0001_initial"), ("tasks", "0004_event_kind_step_result")]


@pytest.mark.django_db(transaction=True)
def test_a_secret_stored_before_the_move_is_read_after_it() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_THE_MOVE)
    old_model = executor.loader.project_state(BEFORE_THE_MOVE).apps.get_model("boxsite", "VaultSecret")
    old_model.objects.create(name="MODEL_API_KEY", ciphertext=crypto.encrypt("sk-kept-across-the-move"))

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert vault.read_secret("MODEL_API_KEY") == "sk-kept-across-the-move"
