"""``stop_at_payment`` fails safe on checkouts shaped like real ones: card fields in a provider's
frame on another origin, a saved-card review page, French and German checkouts, and a card
number typed into a field the box does not know as a card field. An ordinary form still submits."""
from __future__ import annotations

import pytest

from tasks.browser import payment
from tests.browser.sites import serve
from tests.factories import flow

CARD = "4111111111111111"


def _stopped_before_paying(box, site, steps, posted: str) -> None:
    task = box.create(title="checkout", hosts=["127.0.0.1"], flow=flow(*steps))
    view = box.wait_state(task["id"], "waiting", "done", "failed", timeout=90)
    assert (view["state"], view["waitingFor"], view["continuable"]) == ("waiting", "checkpoint", False), view
    assert site.posts[posted] == 0
    assert CARD not in str(box.events(task["id"]))


def test_card_fields_in_a_frame_from_another_origin_stop_a_plain_confirm(sandboxed, site):
    with serve() as provider:
        frame = f"{provider.url}/card-frame"
        _stopped_before_paying(sandboxed, site, [{"browse": f"{site.url}/framed?frame={frame}"},
                                                 {"click": {"role": "button", "name": "Confirm"}}], "/framed")
    assert provider.gets["/card-frame"] >= 1  # the frame was there to be seen


@pytest.mark.parametrize(("path", "control"), [
    ("/review", "Book now"),  # a saved card: no card field, only the review and its total
    ("/fr", "Payer"),
    ("/de", "Zahlungspflichtig bestellen"),
])
def test_checkouts_without_a_card_field_or_in_other_languages_stop(sandboxed, site, path, control):
    _stopped_before_paying(sandboxed, site, [{"browse": f"{site.url}{path}"},
                                             {"click": {"role": "button", "name": control}}], path)


def test_a_card_number_is_card_data_in_any_field(sandboxed, site):
    _stopped_before_paying(sandboxed, site, [{"browse": f"{site.url}/note"},
                                             {"fill": {"label": "Reference", "value": CARD}},
                                             {"click": {"role": "button", "name": "Save"}}], "/note")


def test_an_ordinary_form_is_not_taken_for_a_checkout(sandboxed, site):
    task = sandboxed.create(title="note", hosts=["127.0.0.1"], flow=flow(
        {"browse": f"{site.url}/note"}, {"fill": {"label": "Reference", "value": "order 4411"}},
        {"click": {"role": "button", "name": "Save"}}))
    view = sandboxed.wait_state(task["id"], "done", "waiting", "failed", timeout=90)
    assert view["state"] == "done", view
    assert site.bodies["/note"] == [{"ref": ["order 4411"]}]


@pytest.mark.parametrize(("label", "verdict"), [
    ("Pay €12.00 now", "pays"), ("Place your order", "pays"), ("Confirm your order", "pays"), ("Subscribe", "may pay"),
    ("Payer", "pays"), ("Valider la commande", "pays"), ("Jetzt kaufen", "pays"), ("Pagar ahora", "pays"),
    ("Finalizar compra", "pays"), ("Acquista ora", "pays"), ("Conferma ordine", "pays"), ("Afrekenen", "pays"),
    ("Bestelling plaatsen", "pays"), ("Réserver", "may pay"), ("Prenota", "may pay"), ("Boeken", "may pay"),
    ("Select", None), ("Save", None), ("Continue to checkout", None), ("Sign in", None),
])
def test_controls_that_pay_are_known_in_the_common_languages(label, verdict):
    assert payment.control_pays({"text": label}) == verdict
