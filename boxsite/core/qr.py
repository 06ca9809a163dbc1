"""The pairing QR code, drawn on the server as an inline SVG (no script, no external service)."""
from __future__ import annotations

import qrcode
import qrcode.image.svg
from django.utils.html import escape


def qr_svg(text: str, label: str = "QR code") -> str:
    """An SVG document encoding ``text``; scales with CSS, dark modules on a white quiet zone."""
    qr = qrcode.QRCode(error_correction=qrcode.constants.ERROR_CORRECT_M, border=4, box_size=10)
    qr.add_data(text)
    qr.make(fit=True)
    image = qr.make_image(image_factory=qrcode.image.svg.SvgPathFillImage)
    svg = image.to_string(encoding="unicode")
    # Drop the XML declaration so the document can be inlined into a page.
    svg = svg[svg.index("<svg"):]
    # A screen reader announces the image by its label instead of reading path data.

    return svg.replace("<svg ", f'<svg role="img" aria-label="{escape(label)}" class="qr" ', 1)
