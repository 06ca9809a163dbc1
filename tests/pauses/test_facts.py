"""Facts and secrets: which values are secret, and the one redaction function."""
from __future__ import annotations

import base64
import json

import pytest

from tasks.vault.facts import Facts, Redactor, guess_kind, is_sensitive_name, looks_like_card, mask_cards

KEY = "-----BEGIN KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf\n9Cnzj4p4WGeKLs1Pt8Qu\n-----END KEY-----"


@pytest.mark.parametrize("name", ["password", "cardNumber", "card_number", "CVV", "otp", "one time code", "passport no",
                                  "iban", "api key", "API_KEY", "githubToken", "db_password", "mypassword", "pin",
                                  "ssh key", "client secret", "Aadhaar", "pan", "secrets"])
def test_sensitive_names_are_secret(name):
    assert is_sensitive_name(name)


@pytest.mark.parametrize("name", ["first name", "email", "city", "pancake", "author", "keyword", "date of birth", "phone"])
def test_ordinary_names_are_shared(name):
    assert not is_sensitive_name(name)


@pytest.mark.parametrize(("name", "kind"), [("email", "email"), ("contact_email", "email"), ("mobile", "phone"),
                                            ("phone number", "phone"), ("date of birth", "date"), ("dob", "date"),
                                            ("number of travellers", "number"), ("count", "number"), ("city", "text")])
def test_the_input_kind_is_guessed_from_the_name(name, kind):
    assert guess_kind(name) == kind


def test_card_numbers_are_luhn_valid_runs_of_13_to_19_digits():
    assert looks_like_card("4111 1111 1111 1111") and looks_like_card("4111-1111-1111-1111")
    assert looks_like_card("pay 5555555555554444 now")
    assert not looks_like_card("4111 1111 1111 1112")  # fails Luhn
    assert not looks_like_card("call 2024-05-01 at 10:30")
    assert mask_cards("a 4111111111111111 b 1234") == "a ${card} b 1234"


def test_a_caller_can_add_secrets_but_never_make_a_sensitive_name_shared():
    facts = Facts.build({"password": "hunter2", "city": "Pune", "nick": "bob", "payment": "4111111111111111"}, ["nick"])
    assert facts.secret_names == {"password", "nick", "payment"}
    assert facts.shared() == {"city": "Pune"}
    assert facts.shown()["password"] == "${password}"


def test_secret_values_are_sealed_at_rest_and_read_back():
    facts = Facts.build({"password": "hunter2-sealed", "city": "Pune"})
    stored = facts.sealed()
    assert stored["city"] == "Pune" and "hunter2" not in json.dumps(stored)
    again = Facts.build(stored)
    assert again.values == {"password": "hunter2-sealed", "city": "Pune"}
    assert again.secret_names == {"password"}


def test_the_redactor_masks_values_lines_and_encodings():
    redact = Redactor({"password": "hunter2-xyz", "key": KEY})
    assert redact.text("login hunter2-xyz ok") == "login ${password} ok"
    assert redact.text(KEY) == "${key}"
    assert redact.text("line: 9Cnzj4p4WGeKLs1Pt8Qu") == "line: ${key}"
    assert redact.text(base64.b64encode(KEY.encode()).decode()) == "${key}"
    wrapped = base64.encodebytes(KEY.encode()).decode()
    assert set(redact.text(wrapped).splitlines()) == {"${key}"}
    inside = base64.b64encode(b"user=admin;pw=hunter2-xyz;").decode()
    assert "${password}" in redact.text(inside)
    assert redact.text(json.dumps({"k": KEY})) == '{"k": "${key}"}'  # the value as JSON text, \n escaped
    assert redact.redact({"hunter2-xyz": ["hunter2-xyz", 3]}) == {"${password}": ["${password}", 3]}


def test_a_placeholder_is_never_redacted_again():
    redact = Redactor({"password": "pass", "word": "word"})
    assert redact.text("pass word") == "${password} ${word}"
