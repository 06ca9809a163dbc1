"""Fixtures for model-driven work: the fake chat-completions server, configured as the box's model."""
from __future__ import annotations

from typing import Any

import pytest

from tests.fakemodel import FakeModel, fake_model  # noqa: F401 - a fixture
from tests.pauses.conftest import _release_what_tests_leave_waiting  # noqa: F401 - a fixture

KEY = "sk-test-the-models-key-7f3a9c"


@pytest.fixture
def model(box: Any, fake_model: FakeModel) -> FakeModel:  # noqa: F811
    """The box's model is the fake server, with a key in the vault and prices of 100¢ per
    million input tokens and 200¢ per million output tokens."""
    response = box.api.patch("/api/settings/model", {
        "baseUrl": fake_model.base_url, "model": "fake-model", "keyName": "MODEL_API_KEY", "key": KEY,
        "inputCentsPerMillion": 100, "outputCentsPerMillion": 200}, format="json")
    assert response.status_code == 200, response.json()
    return fake_model
