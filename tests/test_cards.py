"""The card redactor masks what looks like a card and leaves ordinary numbers alone."""
from __future__ import annotations

import random

import pytest

from tasks.vault.facts import looks_like_card, mask_cards
from tests.factories import flow

SIZES = "sizes: 1 299986 299985 0 bytes"  # its digits pass the Luhn check


@pytest.mark.parametrize("text", [
    "4111 1111 1111 1111", "4111-1111-1111-1111", "pay 5555555555554444 now", "amex 3782 822463 10005",
    "card: 6011111111111117", "visa 4012888888881881.", "my credit card is 1234567812345670",
])
def test_a_number_printed_like_a_card_is_masked(text: str) -> None:
    assert looks_like_card(text)
    assert "${card}" in mask_cards(text)


@pytest.mark.parametrize("text", [
    SIZES, "ids 1234567812345670 and more",  # Luhn-valid, but no issuer prefix and no card nearby
    "41111111111111111111111", "v3.4111111111111111", "x4111111111111111", "4111 1111 1111 1111 1",
    "41 1111 1111 1111 11", "4111 1111-1111 1111", "2024-05-01 10:30:00 12345", "4111 1111 1111 1112",
])
def test_an_ordinary_number_is_left_alone(text: str) -> None:
    assert not looks_like_card(text)
    assert mask_cards(text) == text


def test_few_random_digit_runs_are_taken_for_cards() -> None:
    rng = random.Random(16)
    runs = ["".join(rng.choice("0123456789") for _ in range(rng.randint(13, 19))) for _ in range(20_000)]
    masked = sum(1 for run in runs if looks_like_card(run))
    assert masked / len(runs) < 0.02  # the Luhn check alone passes about one in ten


def test_lists_of_numbers_are_never_taken_for_cards() -> None:
    rng = random.Random(7)
    for _ in range(5_000):
        text = "sizes: " + " ".join(str(rng.randint(0, 10 ** rng.randint(1, 7))) for _ in range(rng.randint(2, 6)))
        assert mask_cards(text) == text


def test_a_saved_list_of_sizes_reaches_the_next_step_and_the_log_unchanged(box) -> None:
    task = box.create(title="sizes", flow=flow({"run": f"echo '{SIZES}'", "save": "sizes"},
                                               {"run": "echo \"got ${sizes}\"", "save": "echoed"}))
    box.wait_state(task["id"], "done")
    records = box.api.get(f"/api/tasks/{task['id']}/report").json()["records"]
    assert records["sizes"] == SIZES and records["echoed"] == f"got {SIZES}"
    log = " ".join(str(e) for e in box.events(task["id"]))
    assert "${card}" not in log and "299986 299985" in log
