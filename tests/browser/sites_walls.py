"""Local sites with walls a person passes: a members' area behind a login form (its fields at
fixed places, so a test can click them through the live view), a code check whose only sign is
its ``autocomplete="one-time-code"`` field, and pages whose wall is only in their DOM (a captcha
provider's frame, a visible password field). Each counts what it was sent."""
from __future__ import annotations

from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

from tests.browser.sites import running

PAGE = "<!doctype html><html><head><meta charset=utf-8><title>{title}</title></head><body style='margin:0'>{body}</body></html>"

# Where the login form's parts are on the page (CSS pixels): the test clicks their middles.
USER_BOX = (40, 120, 300, 40)
PASSWORD_BOX = (40, 200, 300, 40)
BUTTON_BOX = (40, 280, 300, 40)


def _at(box: tuple[int, int, int, int]) -> str:
    left, top, width, height = box
    return f"position:absolute;left:{left}px;top:{top}px;width:{width}px;height:{height}px;box-sizing:border-box"


def middle(box: tuple[int, int, int, int]) -> tuple[float, float]:
    left, top, width, height = box
    return left + width / 2, top + height / 2


MEMBERS = f"""<h1>Please sign in to continue</h1>
<form method=post action=/members/login>
  <input id=user name=user aria-label=User style="{_at(USER_BOX)}">
  <input id=pass name=password type=password aria-label=Password style="{_at(PASSWORD_BOX)}">
  <button type=submit style="{_at(BUTTON_BOX)}">Sign in</button>
</form>"""
HOME = """<h1>Your account</h1><a href=/members/checkout>Continue to checkout</a>"""
CHECKOUT = """<h1>Checkout for {who}</h1>"""
VERIFY = """<h1>Check your phone</h1><form method=post action=/verify>
<label>Code <input name=code autocomplete=one-time-code inputmode=numeric></label><button>Verify</button></form>"""
VERIFIED = """<h1>Thanks</h1><a href=/members/checkout>Continue to checkout</a>"""
CAPTCHA_FRAME = """<h1>One moment</h1><iframe title=check src="https://newassets.hcaptcha.com/captcha/v1/frame"></iframe>"""
QUIET_PASSWORD = """<h1>Hello</h1><form><input name=u><input type=password name=p><button>Go</button></form>"""
HIDDEN_PASSWORD = """<h1>Hello</h1><form><input type=password name=p style="display:none"></form>"""

PAGES = {"/members": MEMBERS, "/members/home": HOME, "/verify": VERIFY, "/verified": VERIFIED,
         "/captcha-frame": CAPTCHA_FRAME, "/quiet-password": QUIET_PASSWORD, "/hidden-password": HIDDEN_PASSWORD}


@dataclass
class WallSite:
    port: int
    gets: Counter[str] = field(default_factory=Counter)
    posts: Counter[str] = field(default_factory=Counter)
    bodies: dict[str, list[dict[str, list[str]]]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(site: WallSite) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook
            path = self.path.split("?", 1)[0]
            site.gets[path] += 1
            if path == "/members/checkout":
                cookie = SimpleCookie(self.headers.get("Cookie", ""))
                who = cookie["who"].value if "who" in cookie else "nobody"
                self._send(200, PAGE.format(title="Checkout", body=CHECKOUT.format(who=who)))
            elif path in PAGES:
                self._send(200, PAGE.format(title=path.strip("/"), body=PAGES[path]))
            else:
                self._send(404, "not here")

        def do_POST(self) -> None:  # noqa: N802 - the http.server hook
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = parse_qs(self.rfile.read(length).decode())
            site.posts[path] += 1
            site.bodies.setdefault(path, []).append(body)
            if path == "/members/login":
                who = (body.get("user") or ["?"])[0]
                self._send(303, headers={"Location": "/members/home", "Set-Cookie": f"who={who}; Path=/"})
            elif path == "/verify":
                self._send(303, headers={"Location": "/verified"})
            else:
                self._send(404, "not here")

    return Handler


def serve() -> AbstractContextManager[WallSite]:
    return running(WallSite(0), _handler)
