"""Local test pages for the actions real flows need: an upload form, a download, dialogs, a
popup, a form in a frame, a button in a shadow root, a search submitted with Enter, text that
appears later, list boxes, and a card form with no submit button."""
from __future__ import annotations

from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

from tests.browser.sites import running

PAGE = "<!doctype html><html><head><meta charset=utf-8><title>{title}</title></head><body>{body}</body></html>"

UPLOAD = """<h1>Send your CV</h1>
<label for=cv>Your CV</label> <input type=file id=cv name=cv style="opacity:0;width:1px">
<p id=got>nothing yet</p>
<script>document.getElementById('cv').addEventListener('change', async e => {
  const f = e.target.files[0];
  document.getElementById('got').innerText = f.name + ': ' + (await f.text());
});</script>"""
DOWNLOAD = """<h1>Reports</h1><a href="/report.csv">Export the report</a> <a href="/huge.bin">Export everything</a>"""
REPORT = "route,fare\nDEL-BOM,4321\n"
DIALOGS = """<h1>Files</h1><p id=out>nothing done</p>
<button id=del>Delete the file</button> <button id=ask>Rename</button> <button id=hi>Say hello</button>
<script>
const out = document.getElementById('out');
document.getElementById('del').onclick = () => { out.innerText = confirm('Delete report.csv?') ? 'deleted' : 'kept'; };
document.getElementById('ask').onclick = () => { const n = prompt('New name?', 'old'); out.innerText = n === null ? 'not renamed' : 'renamed to ' + n; };
document.getElementById('hi').onclick = () => { alert('Hello there'); out.innerText = 'greeted'; };
</script>"""
POPUP = """<h1>Booking</h1><a href="/terms" target="_blank">Read the terms</a>"""
TERMS = """<h1>Terms of carriage</h1><p>Bags: 15 kg.</p>"""
FRAMED = """<h1>Newsletter</h1><iframe id=signup title="Sign up" src="/inner"></iframe>"""
INNER = """<form method=post action=/inner><label for=email>Email</label> <input id=email name=email>
<button type=submit>Sign up</button></form>
<button type=button id=restyle onclick="document.adoptedStyleSheets = []">Restyle</button>"""
SHADOW = """<h1>Events</h1><p id=out>no details</p><event-card></event-card>
<script>
customElements.define('event-card', class extends HTMLElement {
  connectedCallback() {
    const root = this.attachShadow({mode: 'open'});
    root.innerHTML = '<div><span>Concert, 8 pm</span> <button>Show details</button></div>'
      + '<label>Member code <input id=code></label> <button id=restyle>Restyle</button>';
    root.getElementById('restyle').onclick = () => { root.adoptedStyleSheets = []; };
    root.querySelector('button').onclick = () => { document.getElementById('out').innerText = 'Doors open at 7 pm'; };
  }
});
</script>"""
SEARCH = """<h1>Search</h1><form action=/results><input name=q aria-label="Search flights"></form>"""
LATE = """<h1>Status</h1><p id=status>Loading</p>
<script>setTimeout(() => { document.getElementById('status').innerText = 'Ready: 3 offers'; }, 1500);</script>"""
LISTS = """<h1>Options</h1>
<label for=size>Size</label> <select id=size name=size><option value=s>Small</option><option value=m>Medium</option>
<option value=l>Large</option></select>
<label for=extras>Extras</label> <select id=extras name=extras multiple><option value=bag>Bag</option>
<option value=seat>Seat</option><option value=meal>Meal</option></select>
<p id=out></p>
<script>for (const s of document.querySelectorAll('select')) s.addEventListener('change', () => {
  document.getElementById('out').innerText = Array.from(document.querySelectorAll('select'))
    .map(x => x.name + '=' + Array.from(x.selectedOptions).map(o => o.value).join('+')).join(' ');
});</script>"""
CARD = """<h1>Payment</h1><form method=post action=/card><label for=cc>Card number</label>
<input id=cc name=cardnumber autocomplete=cc-number></form>"""


@dataclass
class Site:
    port: int
    gets: Counter[str] = field(default_factory=Counter)
    posts: dict[str, list[dict[str, list[str]]]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    pages = {"/upload": ("Upload", UPLOAD), "/download": ("Download", DOWNLOAD), "/dialogs": ("Dialogs", DIALOGS),
             "/popup": ("Booking", POPUP), "/terms": ("Terms", TERMS), "/framed": ("Newsletter", FRAMED),
             "/inner": ("Inner", INNER), "/shadow": ("Events", SHADOW), "/search": ("Search", SEARCH),
             "/late": ("Status", LATE), "/lists": ("Options", LISTS), "/card": ("Payment", CARD)}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            path, _, query = self.path.partition("?")
            site.gets[path] += 1
            html = {"Content-Type": "text/html; charset=utf-8"}
            if path in pages:
                title, body = pages[path]
                self._send(200, PAGE.format(title=title, body=body).encode(), html)
            elif path == "/report.csv":
                # A name that tries to climb out of the downloads folder.
                self._send(200, REPORT.encode(), {"Content-Type": "text/csv",
                                                  "Content-Disposition": 'attachment; filename="../../.bashrc report.csv"'})
            elif path == "/huge.bin":
                self._send(200, b"x" * (3 * 1024 * 1024), {"Content-Type": "application/octet-stream",
                                                           "Content-Disposition": 'attachment; filename="huge.bin"'})
            elif path == "/results":
                q = parse_qs(query).get("q", [""])[0]
                self._send(200, PAGE.format(title="Results", body=f"<h1>Results for {q}</h1>").encode(), html)
            else:
                self._send(404, PAGE.format(title="Not found", body="<h1>Not found</h1>").encode(), html)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            site.posts.setdefault(self.path, []).append(parse_qs(self.rfile.read(length).decode()))
            self._send(200, PAGE.format(title="Thanks", body=f"<h1>Received {self.path}</h1>").encode(),
                       {"Content-Type": "text/html; charset=utf-8"})

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def serve() -> AbstractContextManager[Site]:
    return running(Site(0), _handler)
