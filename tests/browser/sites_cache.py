"""A local flights site whose list the test changes between two runs of the same cached
instruction: its order, its prices. ``/flights`` lists the offers as list items, ``/cards`` as
plain boxes (no list, no row role: only a CSS path tells two "Select" buttons apart)."""
from __future__ import annotations

import html
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

from tests.browser.sites import running

PAGE = "<!doctype html><html><head><meta charset=utf-8><title>{title}</title></head><body>{body}</body></html>"
PICK = """<script>for (const b of document.querySelectorAll('.offer button')) {
  b.addEventListener('click', () => { location.href = '/chosen?name=' + encodeURIComponent(b.parentNode.querySelector('.name').innerText); });
}</script>"""


@dataclass
class Flights:
    port: int
    # (name, price in rupees), in the order the page lists them
    offers: list[tuple[str, int]] = field(default_factory=lambda: [("Air 07:00", 5120), ("Play 09:10", 4321),
                                                                     ("Sky 12:30", 6000)])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def page(self, path: str) -> str:
        tag, outer = ("li", "ul") if path == "/flights" else ("div", "div")
        items = "".join(f"<{tag} class=offer><span class=name>{html.escape(name)}</span> <span class=price>₹{price:,}</span> "
                        f"<button>Select</button></{tag}>" for name, price in self.offers)
        return PAGE.format(title="Flights", body=f"<h1>Flights</h1><{outer} id=offers>{items}</{outer}>{PICK}")


def _handler(site: Flights) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            path, _, query = self.path.partition("?")
            if path in ("/flights", "/cards"):
                body = site.page(path)
            elif path == "/chosen":
                name = parse_qs(query).get("name", [""])[0]
                body = PAGE.format(title="Chosen", body=f"<h1>You chose {html.escape(name)}</h1>")
            else:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def serve_flights() -> AbstractContextManager[Flights]:
    return running(Flights(0), _handler)


