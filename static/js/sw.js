// The box's service worker, served at /sw.js so that its scope is the whole site.
// It shows the box's Web Push notices and acts on their Approve and Deny buttons: a button
// POSTs its signed, single-use link (never a GET: a GET changes nothing on the box) and says
// how it went. Tapping the notice itself opens the page it names.

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("push", (event) => {
  let data;
  try {
    data = event.data ? event.data.json() : {};
  } catch {
    data = { title: "The box", body: event.data.text() };
  }
  const actions = (data.actions || []).map((a) => ({ action: a.action, title: a.title }));
  event.waitUntil(self.registration.showNotification(data.title || "The box", {
    body: data.body || "",
    tag: data.tag,
    icon: "/static/icon-192.png",
    badge: "/static/icon-192.png",
    data,
    actions,
    requireInteraction: actions.length > 0,
  }));
});

async function useLink(chosen, data) {
  let response;
  try {
    response = await fetch(chosen.url, { method: "POST", credentials: "omit", headers: { Accept: "application/json" } });
  } catch {
    // Offline or unreachable: the link's page lets the owner press the button when it is back.
    return self.clients.openWindow(chosen.page);
  }
  const body = await response.json().catch(() => ({}));
  const title = response.ok ? (chosen.action === "approve" ? "Approved" : "Denied") : "Nothing was decided";
  const text = response.ok ? (body.summary || data.title || "") : (body.message || `the box answered ${response.status}`);
  return self.registration.showNotification(title, { body: text, tag: data.tag, icon: "/static/icon-192.png", data: { url: data.url } });
}

async function openPage(url) {
  const target = new URL(url || "/ask", self.location.origin).href;
  const open = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  for (const client of open) {
    if (client.url === target && "focus" in client) return client.focus();
  }
  return self.clients.openWindow(target);
}

self.addEventListener("notificationclick", (event) => {
  const notice = event.notification;
  const data = notice.data || {};
  notice.close();
  const chosen = (data.actions || []).find((a) => a.action === event.action);
  event.waitUntil(chosen ? useLink(chosen, data) : openPage(data.url));
});
