"""Local test sites the browser tests open through the task's host allowlist: a shop list, a
form, walls (login, captcha, one-time code), and a payment page. Each counts what it was sent."""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol, TypeVar
from urllib.parse import parse_qs

PAGE = "<!doctype html><html><head><meta charset=utf-8><title>{title}</title></head><body>{body}</body></html>"

SHOP = """<h1>Flights</h1>
<ul id=offers>
  <li class=offer><span class=name>Air 07:00</span> <span class=price>₹5,120</span> <button>Select</button></li>
  <li class=offer><span class=name>Play 09:10</span> <span class=price>₹4,321</span> <button>Select</button></li>
  <li class=offer><span class=name>Sky 12:30</span> <span class=price>₹6,000</span> <button>Select</button></li>
</ul>
<table id=fares><tr><th>Route</th><th>Fare</th></tr><tr><td>DEL-BOM</td><td>4321</td></tr><tr><td>DEL-BLR</td><td>5120</td></tr></table>
<script src=/shop.js></script>"""
SHOP_JS = """for (const b of document.querySelectorAll('.offer button')) {
  b.addEventListener('click', () => { location.href = '/chosen?name=' + encodeURIComponent(b.parentNode.querySelector('.name').innerText); });
}"""

FORM = """<h1>Passenger details</h1>
<form method=post action=/form>
  <label for=name>Full name</label> <input id=name name=name>
  <label for=title>Title</label> <select id=title name=title><option>Mr</option><option>Ms</option><option>Dr</option></select>
  <label for=passport>Passport number</label> <input id=passport name=passport>
  <button type=submit>Continue</button>
</form>"""

LOGIN = """<h1>Please sign in to continue</h1><form><label>Email <input name=email></label>
<label>Password <input type=password name=password></label><button>Sign in</button></form>"""
CAPTCHA = """<h1>Are you a robot?</h1><p>Verify you are human: tick the box below.</p><div class=captcha>[ ] I'm not a robot</div>"""
OTP = """<h1>Check your phone</h1><p>Enter the code we sent to your phone.</p><label>One-time code <input name=otp></label>"""

PAY = """<h1>Payment</h1>
<form method=post action=/pay>
  <label for=cc>Card number</label> <input id=cc name=cardnumber autocomplete=cc-number>
  <label for=cvv>CVV</label> <input id=cvv name=cvv autocomplete=cc-csc>
  <button type=submit>Pay now</button>
</form>"""

# Checkouts as real shops build them: the card fields in a provider's frame on another origin, a
# saved-card review page with no card field at all, and checkouts in French and German.
CARD_FRAME = """<label for=n>Card number</label> <input id=n name=number autocomplete=cc-number>
<label for=e>MM / YY</label> <input id=e name=exp autocomplete=cc-exp>"""
FRAMED = """<h1>Checkout</h1><p>Delivery to 1 High Street</p>
<form method=post action=/framed><iframe title="Secure payment input" src="{frame}"></iframe>
<button type=submit>Confirm</button></form>"""
REVIEW = """<h1>Review your order</h1><p>Deliver to: 1 High Street</p><p>Visa ending in 4242</p>
<p>Order total: $42.00</p><form method=post action=/review><button type=submit>Book now</button></form>"""
FRENCH = """<h1>Paiement</h1><p>Total à payer : 12,00 €</p>
<form method=post action=/fr><button type=submit>Payer</button></form>"""
GERMAN = """<h1>Bestellung überprüfen</h1><p>Gesamtsumme: 12,00 €</p>
<form method=post action=/de><button type=submit>Zahlungspflichtig bestellen</button></form>"""
NOTE = """<h1>Leave a note</h1><form method=post action=/note><label for=ref>Reference</label> <input id=ref name=ref>
<button type=submit>Save</button></form>"""
# A page that links elsewhere, one that says whether it may register a service worker, and one
# whose script may be cached for an hour.
AWAY = """<h1>Leaving</h1><a href="{to}">Go on</a>"""
WORKER = """<h1 id=sw>?</h1><script>document.getElementById('sw').innerText = 'serviceWorker' in navigator ? 'can register' : 'none';</script>"""
# A page that changes by itself between two steps: no image of an earlier moment stands for now.
TICKING = """<h1>Departures</h1><p>Updated <span id=tick>0</span></p><button id=a>A</button> <button id=b>B</button>
<script>let n = 0; setInterval(() => { document.getElementById('tick').textContent = String(++n); }, 5);</script>"""
# The same, where only a frame of the page changes.
QUIET_FRAMING = """<h1>Arrivals</h1><iframe id=board title="Board" src="/ticking-board"></iframe><button id=a>A</button>
<button id=b>B</button>"""
TICKING_BOARD = """<p>Updated <span id=tick>0</span></p>
<script>let n = 0; setInterval(() => { document.getElementById('tick').textContent = String(++n); }, 5);</script>"""
CACHED = """<h1 id=c>?</h1><script src=/cached.js></script>"""

# A site that remembers who signed in, in a cookie (a persistent one) and in local storage.
SIGNED_IN = """<h1>Welcome</h1><script>localStorage.setItem('greeting', 'hello again');</script>"""
ACCOUNT = """<h1 id=who>{who}</h1><p id=stored></p>
<script>document.getElementById('stored').innerText = localStorage.getItem('greeting') || 'nothing stored';</script>"""


@dataclass
class Site:
    port: int
    posts: Counter[str] = field(default_factory=Counter)
    bodies: dict[str, list[dict[str, list[str]]]] = field(default_factory=dict)
    gets: Counter[str] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    pages = {"/shop": ("Shop", SHOP), "/form": ("Form", FORM), "/login": ("Sign in", LOGIN),
             "/captcha": ("Check", CAPTCHA), "/otp": ("Code", OTP), "/pay": ("Pay", PAY),
             "/card-frame": ("Card", CARD_FRAME), "/review": ("Review", REVIEW), "/fr": ("Paiement", FRENCH),
             "/de": ("Kasse", GERMAN), "/note": ("Note", NOTE), "/worker": ("Worker", WORKER), "/cached": ("Cached", CACHED),
             "/ticking": ("Ticking", TICKING), "/ticking-framed": ("Arrivals", QUIET_FRAMING),
             "/ticking-board": ("Board", TICKING_BOARD)}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: str, kind: str = "text/html; charset=utf-8") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            path, _, query = self.path.partition("?")
            site.gets[path] += 1
            if path == "/shop.js":
                self._send(200, SHOP_JS, "text/javascript")
            elif path in pages:
                title, body = pages[path]
                self._send(200, PAGE.format(title=title, body=body))
            elif path == "/signin":
                name = parse_qs(query).get("name", ["someone"])[0]
                data = PAGE.format(title="Signed in", body=SIGNED_IN).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Set-Cookie", f"session={name}; Max-Age=86400; Path=/; HttpOnly")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path == "/account":
                cookies = dict(c.strip().split("=", 1) for c in (self.headers.get("Cookie") or "").split(";") if "=" in c)
                who = f"Signed in as {cookies['session']}" if "session" in cookies else "Not signed in"
                self._send(200, PAGE.format(title="Account", body=ACCOUNT.format(who=who)))
            elif path == "/framed":
                frame = parse_qs(query).get("frame", [""])[0]
                self._send(200, PAGE.format(title="Checkout", body=FRAMED.format(frame=frame)))
            elif path == "/away":
                to = parse_qs(query).get("to", ["/"])[0]
                self._send(200, PAGE.format(title="Away", body=AWAY.format(to=to)))
            elif path == "/cached.js":
                data = b"document.getElementById('c').innerText = 'script ran';"
                self.send_response(200)
                self.send_header("Content-Type", "text/javascript")
                self.send_header("Cache-Control", "public, max-age=3600")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path == "/to":
                self.send_response(302)
                self.send_header("Location", parse_qs(query).get("url", ["/"])[0])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path == "/chosen":
                name = parse_qs(query).get("name", [""])[0]
                self._send(200, PAGE.format(title="Chosen", body=f"<h1>You chose {name}</h1>"))
            else:
                self._send(404, PAGE.format(title="Not found", body="<h1>Not found</h1>"))

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            fields = parse_qs(self.rfile.read(length).decode())
            site.posts[self.path] += 1
            site.bodies.setdefault(self.path, []).append(fields)
            self._send(200, PAGE.format(title="Thanks", body=f"<h1>Received {self.path}</h1>"))

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class Port(Protocol):
    port: int


S = TypeVar("S", bound=Port)


@contextmanager
def running(site: S, handler: Callable[[S], type[BaseHTTPRequestHandler]]) -> Iterator[S]:
    """Serve ``handler(site)`` on a free loopback port (given to ``site.port``) for the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(site))
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()


def serve() -> AbstractContextManager[Site]:
    return running(Site(0), _handler)
