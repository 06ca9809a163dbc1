// "Notify this phone": register the box's service worker (so the phone page installs to the
// home screen) and, on the owner's tap, subscribe this browser to Web Push and hand the
// subscription to the box.
import { api } from "./api.js";

const button = document.getElementById("push-subscribe");
const status = document.getElementById("push-status");

function tell(text) {
  status.textContent = text;
  status.hidden = !text;
}

function keyBytes(base64url) {
  const padded = base64url.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (base64url.length % 4)) % 4);
  return Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
}

async function subscribe(registration) {
  button.disabled = true;
  try {
    if ((await Notification.requestPermission()) !== "granted") {
      tell("Notifications are blocked for this page: allow them in the browser's site settings, then try again.");
      return;
    }
    const { publicKey } = await api("GET", "/api/push/key");
    let subscription = await registration.pushManager.getSubscription();
    if (!subscription) {
      subscription = await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(publicKey) });
    }
    const raw = subscription.toJSON();
    await api("POST", "/api/push/subscriptions", { endpoint: raw.endpoint, keys: { p256dh: raw.keys.p256dh, auth: raw.keys.auth } });
    tell("This phone gets the box's notifications.");
  } catch (err) {
    tell(`Could not turn on notifications: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

async function start() {
  if (!("serviceWorker" in navigator)) {
    tell("This browser cannot get notifications from the box.");
    return;
  }
  const registration = await navigator.serviceWorker.register("/sw.js");
  document.documentElement.dataset.serviceWorker = "registered";
  if (!("PushManager" in window) || !("Notification" in window)) {
    tell("This browser cannot get Web Push; add the page to the home screen first (iPhone), or use Apprise URLs.");
    return;
  }
  button.hidden = false;
  if (Notification.permission === "granted" && (await registration.pushManager.getSubscription())) {
    tell("This phone gets the box's notifications.");
  }
  button.addEventListener("click", () => subscribe(registration));
}

if (!window.isSecureContext) {
  tell("Notifications need the box over HTTPS (BOX_PUBLIC_URL behind a TLS proxy): a browser gives Web Push only to secure pages.");
} else {
  start().catch((err) => tell(`Could not start notifications: ${err.message}`));
}
