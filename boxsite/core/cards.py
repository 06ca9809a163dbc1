"""Card-like numbers: the redaction that needs no task's secrets.

The lowest layer of redaction, so the error shape (``boxsite.core.errors``) can apply it without
reaching up into ``tasks``. ``tasks.vault.facts.Redactor`` adds a task's secrets on top.
"""
from __future__ import annotations

import re

# A run of 13-19 digits, optionally split by single spaces or dashes, that is not part of a
# longer number or word: nothing alphanumeric right before or after it, and no digit one
# separator away (``1 2999 8629 9985 0`` is a list of numbers, ``3.4111...`` a decimal).
_CARD_RUN = re.compile(r"(?<!\w)(?<!\d[ .,-])\d(?:[ -]?\d){12,18}(?!\w)(?![ .,-]\d)")
# How card numbers are printed: all together, or in these groups (Visa/Mastercard/Discover/JCB
# 4-4-4-4, 19 digits 4-4-4-4-3, Amex 4-6-5, Diners 4-6-4).
_CARD_GROUPS = {(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4)}
# Issuer prefixes with the lengths they issue (Visa, Mastercard, Amex, Discover, Diners, JCB,
# UnionPay): a Luhn-valid run with none of them is a card only when the text says "card" near it.
_CARD_ISSUERS: tuple[tuple[re.Pattern[str], tuple[int, ...]], ...] = (
    (re.compile(r"4"), (13, 16, 19)),
    (re.compile(r"5[1-5]|2(?:2[2-9]|[3-6]\d|7[01]|720)"), (16,)),
    (re.compile(r"3[47]"), (15,)),
    (re.compile(r"6(?:011|5|4[4-9])"), (16, 17, 18, 19)),
    (re.compile(r"3(?:0[0-5]|[689])"), (14, 15, 16, 17, 18, 19)),
    (re.compile(r"35(?:2[89]|[3-8]\d)"), (16, 17, 18, 19)),
    (re.compile(r"62"), (16, 17, 18, 19)),
)
_CARD_CONTEXT = re.compile(r"card|visa|master|amex|credit|debit|\bcc\b|\bpan\b|payment", re.IGNORECASE)
_CARD_CONTEXT_WINDOW = 32  # characters before a number that may say it is a card


def luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _is_card_digits(run: str, before: str = "") -> bool:
    """``run`` (a ``_CARD_RUN`` match) is printed like a card, passes Luhn, and has a known
    issuer's prefix and length, or ``before`` (the text just ahead of it) mentions a card."""
    separators = set(re.sub(r"\d", "", run))
    if len(separators) > 1:
        return False
    groups = tuple(len(g) for g in re.split(r"[ -]", run)) if separators else (len(run),)
    if len(groups) > 1 and groups not in _CARD_GROUPS:
        return False
    digits = re.sub(r"\D", "", run)
    if not (13 <= len(digits) <= 19 and luhn_valid(digits)):
        return False
    if any(prefix.match(digits) and len(digits) in lengths for prefix, lengths in _CARD_ISSUERS):
        return True
    return bool(_CARD_CONTEXT.search(before[-_CARD_CONTEXT_WINDOW:]))


def looks_like_card(value: str) -> bool:
    """A number printed like a card (all together or in card groups), Luhn-valid, with a known
    issuer's prefix and length or the word card (visa, credit, ...) just before it; never a run
    inside a longer number or a list of numbers."""
    return any(_is_card_digits(m.group(), value[:m.start()]) for m in _CARD_RUN.finditer(value))


def mask_cards(text: str) -> str:
    return _CARD_RUN.sub(lambda m: "${card}" if _is_card_digits(m.group(), text[:m.start()]) else m.group(), text)
