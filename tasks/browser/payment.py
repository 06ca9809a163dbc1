"""Telling the end of a checkout, from many signals, so ``stop_at_payment`` fails safe.

A false stop costs the owner a click; a false pass costs money. So a control that completes a
purchase is judged from its own words in the common languages (English, French, German, Spanish,
Italian, Portuguese, Dutch), and the page from every frame it has: card or payment fields
(``autocomplete="cc-*"``, their names and labels), frames of the known payment providers, a
review-order heading, a total with a currency. A control that can only mean paying ("Pay now",
"Place your order", "Payer", "Zahlungspflichtig bestellen") stops on any page; one that pays on
a checkout ("Confirm", "Book now", "Subscribe") stops when the page shows any one signal.
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

# Controls that only ever complete a purchase.
_PAYS = re.compile(
    r"\b(?:pay(?: now| securely| \S+ now)?|place (?:your |my )?order|submit (?:your )?(?:order|payment)|purchase|"
    r"buy now|complete (?:the |your |my )?(?:purchase|order|payment|checkout)|confirm (?:and |& )?pay|"
    r"confirm (?:your |my |the )?(?:order|purchase|booking|payment)|checkout and pay|"
    r"order and pay|pay and (?:book|order)|"
    r"payer|acheter|passer (?:la |ma )?commande|valider (?:et payer|(?:la |ma )?commande)|confirmer (?:et payer|(?:la |ma )?commande)|"
    r"commander et payer|finaliser (?:la |ma )?commande|"
    r"bezahlen|jetzt kaufen|kaufen|zahlungspflichtig bestellen|kostenpflichtig bestellen|bestellung abschlie(?:ß|ss)en|"
    r"kauf abschlie(?:ß|ss)en|"
    r"pagar(?: ahora| agora)?|comprar(?: ahora| agora)?|realizar (?:el )?pedido|confirmar (?:el |o )?(?:pedido|pago|pagamento|compra)|"
    r"finalizar (?:la |a )?compra|tramitar pedido|fazer (?:o )?pedido|finalizar pedido|"
    r"paga(?: ora)?|acquista(?: ora)?|conferma (?:l'|e paga|ordine|acquisto|pagamento)|completa (?:l'acquisto|l'ordine)|"
    r"effettua (?:l'|il )?(?:ordine|pagamento)|"
    r"betalen|nu betalen|afrekenen|bestelling plaatsen|bestellen en betalen|koop nu|nu kopen)\b",
    re.IGNORECASE)
# Controls that complete a purchase when the page is a checkout.
_MAY_PAY = re.compile(
    r"\b(?:confirm|order|book(?: now)?|reserve|subscribe|start (?:my |your )?(?:subscription|membership|plan)|"
    r"upgrade|donate|"
    r"confirmer|commander|réserver|s'abonner|abonner|valider|"
    r"bestellen|buchen|jetzt buchen|reservieren|abonnieren|bestätigen|"
    r"reservar|suscribirse|suscribirme|confirmar|assinar|encomendar|"
    r"ordina|prenota|abbonati|conferma|"
    r"boeken|reserveren|abonneren|bevestigen)\b",
    re.IGNORECASE)
# Card and payment fields, by id, name, label, placeholder or aria-label.
CARD_FIELD = (
    r"card.?num|cc-?num|cardnumber|credit.?card|debit.?card|\bcvv|\bcvc|\bcsc\b|security.?code|expir|\bexp\b|"
    r"card.?holder|name.?on.?card|\biban\b|"
    r"num[ée]ro de (?:la )?carte|cryptogramme|date d'expiration|"
    r"karten.?nummer|kreditkarte|pr[üu]f.?(?:nummer|ziffer)|ablaufdatum|g[üu]ltig bis|"
    r"n[úu]mero de (?:la |do )?(?:tarjeta|cart[ãa]o)|caducidad|validade|"
    r"numero (?:della )?carta|scadenza|"
    r"kaart.?nummer|vervaldatum"
)
# A heading or text that says the order is being reviewed before it is placed.
_REVIEW = (
    r"review (?:your |and place (?:your )?)?order|order (?:summary|review)|confirm your order|payment (?:details|method|information)|"
    r"récapitulatif de (?:la |votre )?commande|vérifiez votre commande|moyen de paiement|"
    r"bestell(?:übersicht|ung überprüfen)|zahlungs(?:art|methode|informationen)|"
    r"resumen del pedido|revisa tu pedido|m[ée]todo de pago|forma de pagamento|resumo do pedido|"
    r"riepilogo (?:dell'|del )?ordine|metodo di pagamento|"
    r"besteloverzicht|betaalmethode|controleer je bestelling"
)
_CURRENCY = r"[$€£¥₹₩₽₺]|\b(?:usd|eur|gbp|chf|jpy|inr|cad|aud|sek|nok|dkk|pln|brl|mxn)\b|\bkr\b|\bzł"
_AMOUNT = r"\d[\d.,\s]*\d|\d"
# "Total" in the same languages, followed (or preceded) closely by an amount with a currency.
_TOTAL = (
    r"(?:order total|grand total|total(?: due| to pay| à payer| a pagar| da pagare)?|amount due|montant|"
    r"gesamt(?:summe|betrag)?|summe|importe|totale|totaal|te betalen)"
    rf"[^\n\d]{{0,24}}(?:(?:{_CURRENCY})\s?(?:{_AMOUNT})|(?:{_AMOUNT})\s?(?:{_CURRENCY}))"
)
# Frames served by payment providers: their card fields live on another origin.
PAYMENT_HOSTS = (
    "stripe.com", "stripe.network", "adyen.com", "adyenpayments.com", "braintreegateway.com", "braintree-api.com",
    "paypal.com", "paypalobjects.com", "checkout.com", "squareup.com", "squarecdn.com", "pay.google.com",
    "klarna.com", "klarnaservices.com", "mollie.com", "worldpay.com", "authorize.net", "recurly.com", "chargebee.com",
    "paddle.com", "razorpay.com", "mercadopago.com", "payu.com", "2checkout.com", "verifone.cloud", "globalpay.com",
    "cybersource.com", "shopifycs.com", "afterpay.com",
)
_FRAME_WORDS = r"card|payment|paiement|zahlung|pago|pagamento|betaal|checkout"

# Read in every frame: what says "this is the end of a checkout". One string per signal.
_SIGNALS_JS = """([cardField, review, total, frameWords, hosts]) => {
    const found = [];
    const fieldRe = new RegExp(cardField, 'i');
    for (const e of document.querySelectorAll('input, select, textarea')) {
        if ((e.getAttribute('autocomplete') || '').trim().toLowerCase().startsWith('cc-')) { found.push('a card field (autocomplete)'); break; }
        const label = e.labels && e.labels.length ? e.labels[0].innerText : '';
        const words = [e.id, e.name, e.getAttribute('placeholder'), e.getAttribute('aria-label'), label].join(' ');
        if (fieldRe.test(words)) { found.push('a card field'); break; }
    }
    const frameRe = new RegExp(frameWords, 'i');
    for (const f of document.querySelectorAll('iframe, frame')) {
        let host = '';
        try { host = new URL(f.src, location.href).hostname.toLowerCase(); } catch (err) {}
        if (hosts.some(h => host === h || host.endsWith('.' + h))) { found.push('a payment provider frame (' + host + ')'); break; }
        if (frameRe.test([f.title, f.name, f.id].join(' '))) { found.push('a payment frame'); break; }
    }
    const text = (document.body ? document.body.innerText : '').slice(0, 50000);
    if (new RegExp(review, 'i').test(text)) found.push('an order review');
    if (new RegExp(total, 'i').test(text)) found.push('a total with a currency');
    return found;
}"""


def control_pays(element: dict[str, Any]) -> str | None:
    """``"pays"`` for a control that can only complete a purchase, ``"may pay"`` for one that does
    on a checkout, else None. Judged from its visible text, accessible name, value and id."""
    words = " ".join(str(element.get(k, "")) for k in ("text", "ariaLabel", "name", "id", "label"))
    words = re.sub(r"[_-]+", " ", words)
    if _PAYS.search(words):
        return "pays"
    if _MAY_PAY.search(words):
        return "may pay"
    return None


def page_signals(page: Page) -> list[str]:
    """What, in any frame of the page, says it is the end of a checkout. A frame that cannot be
    read (gone, or still loading) counts as a signal when it comes from a payment provider."""
    signals: list[str] = []
    args = [CARD_FIELD, _REVIEW, _TOTAL, _FRAME_WORDS, list(PAYMENT_HOSTS)]
    for frame in page.frames:
        host = (urlsplit(frame.url).hostname or "").lower()
        if any(host == h or host.endswith("." + h) for h in PAYMENT_HOSTS):
            signals.append(f"a payment provider frame ({host})")
        try:
            signals.extend(frame.evaluate(_SIGNALS_JS, args))
        except PlaywrightError:
            continue
    return list(dict.fromkeys(signals))


def looks_like_card_field(element: dict[str, Any]) -> bool:
    if str(element.get("autocomplete", "")).strip().lower().startswith("cc-"):
        return True
    words = " ".join(str(element.get(k, "")) for k in ("id", "name", "label", "ariaLabel", "placeholder"))
    return re.search(CARD_FIELD, words, re.IGNORECASE) is not None


def stops_before(page: Page, element: dict[str, Any]) -> list[str] | None:
    """Why pressing ``element`` would complete a purchase (the signals seen), or None."""
    pays = control_pays(element)
    if pays is None:
        return None
    signals = page_signals(page)
    if pays == "pays":
        return ["a control that pays", *signals]
    return signals or None
