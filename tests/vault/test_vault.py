"""The vault: write-only secrets, encrypted at rest, rotated without losing a row."""
from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from boxsite.models import Device, hash_key
from tasks import notify
from tasks.models import Task
from tasks.vault import crypto
from tasks.vault.facts import Facts
from tasks.vault.store import read_secret, rows_on_old_keys

SECRET = "sk-live-4f9a1c0ffee-DO-NOT-SHOW"


def raw_ciphertext(name: str) -> bytes:
    with connection.cursor() as cursor:  # the row as it sits in the database, no model code
        cursor.execute("SELECT ciphertext FROM boxsite_vaultsecret WHERE name = %s", [name])
        return bytes(cursor.fetchone()[0])


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes]:
    first, second = Fernet.generate_key(), Fernet.generate_key()
    monkeypatch.setenv("BOX_SECRET_KEY", first.decode())
    return first, second


def test_the_api_sets_lists_and_deletes_secrets_and_never_returns_a_value(box: Any, keys: Any) -> None:
    created = box.api.post("/api/vault", {"name": "OPENAI_API_KEY", "value": SECRET}, format="json")
    assert created.status_code == 201 and created.json()["name"] == "OPENAI_API_KEY"
    replaced = box.api.post("/api/vault", {"name": "OPENAI_API_KEY", "value": SECRET + "2"}, format="json")
    assert replaced.status_code == 200
    listed = box.api.get("/api/vault")
    assert [s["name"] for s in listed.json()["secrets"]] == ["OPENAI_API_KEY"]
    for response in (created, replaced, listed):
        assert SECRET not in response.content.decode()
        assert "value" not in json.dumps(response.json()) and "ciphertext" not in json.dumps(response.json())
    assert box.api.delete("/api/vault/OPENAI_API_KEY").status_code == 204
    assert box.api.get("/api/vault").json()["secrets"] == []
    gone = box.api.delete("/api/vault/OPENAI_API_KEY")
    assert gone.status_code == 404 and gone.json()["code"] == "NOT_FOUND"


def test_bad_names_and_values_are_refused(box: Any, keys: Any) -> None:
    bad_name = box.api.post("/api/vault", {"name": "1; rm -rf", "value": "x"}, format="json")
    assert bad_name.status_code == 400 and bad_name.json()["field"] == "name"
    empty = box.api.post("/api/vault", {"name": "OK_NAME", "value": ""}, format="json")
    assert empty.status_code == 400 and empty.json()["field"] == "value"
    extra = box.api.post("/api/vault", {"name": "OK_NAME", "value": "x", "show": True}, format="json")
    assert extra.status_code == 400


def test_a_paired_phone_cannot_read_or_change_the_vault(box: Any, keys: Any) -> None:
    Device.objects.create(user=box.owner, name="phone", key_hash=hash_key("device-raw-key"))
    phone = APIClient()
    phone.cookies["box_device"] = "device-raw-key"
    response = phone.get("/api/vault")
    assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN"


def test_values_are_encrypted_at_rest(box: Any, keys: tuple[bytes, bytes]) -> None:
    box.api.post("/api/vault", {"name": "STRIPE_KEY", "value": SECRET}, format="json")
    stored = raw_ciphertext("STRIPE_KEY")
    assert SECRET.encode() not in stored
    assert Fernet(keys[0]).decrypt(stored).decode() == SECRET


def test_rotation_reencrypts_every_row_and_the_old_key_decrypts_until_then(box: Any, keys: tuple[bytes, bytes],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = keys
    for name in ("ONE", "TWO", "THREE"):
        box.api.post("/api/vault", {"name": name, "value": f"{SECRET}-{name}"}, format="json")
    monkeypatch.setenv("BOX_SECRET_KEY", f"{new.decode()},{old.decode()}")
    # During rotation: rows still under the old key read fine, new writes use the new key.
    assert read_secret("ONE") == f"{SECRET}-ONE"
    box.api.post("/api/vault", {"name": "FOUR", "value": f"{SECRET}-FOUR"}, format="json")
    Fernet(new).decrypt(raw_ciphertext("FOUR"))

    call_command("rotatevaultkey", stdout=open(os.devnull, "w"))
    for name in ("ONE", "TWO", "THREE", "FOUR"):
        stored = raw_ciphertext(name)
        assert Fernet(new).decrypt(stored).decode() == f"{SECRET}-{name}"
        with pytest.raises(InvalidToken):
            Fernet(old).decrypt(stored)
    monkeypatch.setenv("BOX_SECRET_KEY", new.decode())  # the old key is gone; nothing is lost
    assert read_secret("TWO") == f"{SECRET}-TWO"


def test_a_generated_key_file_is_private_and_rotates_in_place(box: Any, settings: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOX_SECRET_KEY", raising=False)
    monkeypatch.delenv("BOX_SECRET_KEY_FILE", raising=False)
    settings.BOX_DATA_DIR = tmp_path
    box.api.post("/api/vault", {"name": "ONE", "value": SECRET}, format="json")
    key_file = tmp_path / "vault.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    first = crypto.keys()[0]

    call_command("rotatevaultkey", "--generate", "--retire", stdout=open(os.devnull, "w"))
    now = crypto.keys()
    assert len(now) == 1 and now[0] != first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert read_secret("ONE") == SECRET
    with pytest.raises(InvalidToken):
        Fernet(first).decrypt(raw_ciphertext("ONE"))


def test_retiring_keys_from_the_environment_is_left_to_the_owner(box: Any, keys: tuple[bytes, bytes],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    box.api.post("/api/vault", {"name": "ONE", "value": SECRET}, format="json")
    monkeypatch.setenv("BOX_SECRET_KEY", f"{keys[1].decode()},{keys[0].decode()}")
    out = io.StringIO()
    call_command("rotatevaultkey", "--retire", stdout=out)
    assert "now remove the old keys from BOX_SECRET_KEY" in out.getvalue()


def test_keys_can_come_from_a_file(box: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = Fernet.generate_key()
    key_path = tmp_path / "secret-key"
    key_path.write_bytes(key + b"\n")
    monkeypatch.delenv("BOX_SECRET_KEY", raising=False)
    monkeypatch.setenv("BOX_SECRET_KEY_FILE", str(key_path))
    box.api.post("/api/vault", {"name": "ONE", "value": SECRET}, format="json")
    assert Fernet(key).decrypt(raw_ciphertext("ONE")).decode() == SECRET


def test_a_secret_hidden_in_a_string_shaped_as_a_timestamp_is_still_masked(box: Any, keys: Any) -> None:
    task = box.create(title="pin", facts={"pin": "4821"}, flow={"steps": [{"run": "echo 2026-01-01T00:00:00.482100+00:00"}]})
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done["error"]
    logged = json.dumps(box.events(task["id"]))
    assert "4821" not in logged and "2026-01-01T00:00:00.${pin}00+00:00" in logged


def test_rotation_also_reencrypts_secret_facts_sealed_in_tasks(box: Any, keys: tuple[bytes, bytes],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = keys
    task = box.create(title="login", prompt="log in", facts={"password": "hunter2-very-secret", "city": "Oslo"})
    stored = Task.objects.get(pk=task["id"]).facts
    assert "hunter2-very-secret" not in json.dumps(stored)  # sealed at rest
    monkeypatch.setenv("BOX_SECRET_KEY", f"{new.decode()},{old.decode()}")
    out = io.StringIO()
    call_command("rotatevaultkey", "--retire", stdout=out)
    assert "now remove the old keys" in out.getvalue()  # nothing was left on the old key
    monkeypatch.setenv("BOX_SECRET_KEY", new.decode())
    facts = Facts.of(Task.objects.get(pk=task["id"])).values
    assert facts["password"] == "hunter2-very-secret" and facts["city"] == "Oslo"


def test_rotation_also_reencrypts_the_notification_urls_of_the_settings(box: Any, keys: tuple[bytes, bytes],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = keys
    url = "ntfy://tk_rotated-token-4410@ntfy.example.org/box"
    assert box.api.patch("/api/settings", {"notifyUrls": [url]}, format="json").status_code == 200
    monkeypatch.setenv("BOX_SECRET_KEY", f"{new.decode()},{old.decode()}")
    assert "settings notifyUrls" in rows_on_old_keys()
    call_command("rotatevaultkey", stdout=open(os.devnull, "w"))
    assert "settings notifyUrls" not in rows_on_old_keys()
    monkeypatch.setenv("BOX_SECRET_KEY", new.decode())  # the old key is gone; the URL is still there
    assert notify.stored_urls() == [url]
