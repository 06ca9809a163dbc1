// The Triggers page: webhooks (created with their URL and secret shown once, secret rotation,
// pause/resume/delete, recent deliveries) and watched folders (file arrival).
import { api, el, put, putKeepingOpen, say, when } from "./api.js";
import { confirmThen } from "./render.js";
import { actionButton, submitWith, syncWorker, templateFrom } from "./schedule-forms.js";

const $ = (id) => document.getElementById(id);
const form = $("trigger-form");
const value = (name) => form.querySelector(`[data-field="${name}"]`);

const lists = {
  webhook: { list: $("webhook-list"), empty: $("no-webhooks"), more: $("more-webhooks"), next: null },
  file: { list: $("file-list"), empty: $("no-files"), more: $("more-files"), next: null },
};

// --- lists ----------------------------------------------------------------------------------
async function load(kind, { append = false } = {}) {
  const view = lists[kind];
  const params = new URLSearchParams({ kind, limit: "20" });
  if (append && view.next) params.set("cursor", view.next);
  try {
    const page = await api("GET", `/api/triggers?${params}`);
    const rows = page.results.map(kind === "webhook" ? webhookRow : fileRow);
    if (append) view.list.append(...rows); else putKeepingOpen(view.list, "trigger", rows);
    view.next = page.next;
    view.more.hidden = !page.next;
    view.empty.hidden = view.list.children.length > 0;
  } catch (err) {
    put(view.list, el("li", { class: "error" }, err.message));
  }
}
for (const kind of Object.keys(lists)) lists[kind].more.addEventListener("click", () => load(kind, { append: true }));

function taskLink(id, text) {
  return id ? el("a", { href: `/tasks/${encodeURIComponent(id)}` }, text ?? id) : null;
}

function fact(label, ...value) {
  return el("div", {}, el("dt", {}, label), el("dd", {}, ...value));
}

function lastFired(t) {
  return t.lastFiredAt
    ? [el("time", { datetime: t.lastFiredAt }, when(t.lastFiredAt)), " · ", taskLink(t.lastTask, "its task")]
    : ["never"];
}

function named(buttons, name) {
  for (const button of buttons) button.setAttribute("aria-label", `${button.textContent} ${name}`);
  return buttons;
}

// A test delivery: signed by the box with the webhook's secret and received like a real one.
async function sendTest(t) {
  const sent = await api("POST", `/api/triggers/${t.id}/test`, {});
  await load(t.kind);
  say(`Test delivery sent to ${t.name}: task ${sent.task} started`);
}

function pauseButton(t) {
  return t.paused
    ? actionButton("Resume", "primary", () => change(t, "resume", `Resumed ${t.name}`), say)
    : actionButton("Pause", "", () => change(t, "pause", `Paused ${t.name}`), say);
}

function head(t, ...badges) {
  return el("div", { class: "task-row-head" },
    el("h3", { class: "task-title" }, t.name),
    el("span", {}, ...badges, " ", el("span", { class: `badge status-${t.paused ? "paused" : "active"}` }, t.paused ? "paused" : "active")));
}

function webhookRow(t) {
  const buttons = [pauseButton(t), actionButton("Send a test", "", () => sendTest(t), say),
    actionButton("Rotate secret", "", () => rotate(t), say)];
  if (t.rotating) buttons.push(actionButton("Finish rotation", "", () => finishRotation(t), say));
  buttons.push(actionButton("Delete", "danger", () => remove(t), say));

  const deliveries = el("ol", { class: "firings", "aria-label": `Recent deliveries to ${t.name}` });
  const details = el("details", { class: "firings-box" }, el("summary", {}, "Recent deliveries"), deliveries);
  details.addEventListener("toggle", () => { if (details.open) loadDeliveries(t, deliveries); });

  return el("li", { class: "sched-row", "data-trigger": String(t.id) },
    head(t, t.rotating ? el("span", { class: "badge status-attention" }, "rotating") : null),
    el("p", { class: "cadence" }, el("code", { class: "url" }, t.url)),
    t.rotating ? el("p", { class: "hint" }, `The previous secret also works until ${t.previousSecretExpiresAt ? when(t.previousSecretExpiresAt) : "you finish the rotation"}.`) : null,
    el("dl", { class: "facts" },
      fact("Last delivery", ...lastFired(t)),
      fact("Starts", el("span", { class: "template-title" }, t.template?.title ?? "")),
      fact("Created", when(t.createdAt))),
    el("div", { class: "buttons" }, named(buttons, t.name)),
    details);
}

function fileRow(t) {
  const buttons = [pauseButton(t), actionButton("Delete", "danger", () => remove(t), say)];
  return el("li", { class: "sched-row", "data-trigger": String(t.id) },
    head(t),
    el("p", { class: "cadence" }, "Watches ", el("code", {}, t.folder), ` · a file must stay unchanged for ${t.settleSeconds} s`),
    el("dl", { class: "facts" },
      fact("Last file", ...lastFired(t)),
      fact("Starts", el("span", { class: "template-title" }, t.template?.title ?? "")),
      fact("Created", when(t.createdAt))),
    el("div", { class: "buttons" }, named(buttons, t.name)));
}

async function loadDeliveries(t, target) {
  put(target, el("li", { class: "empty" }, "Loading…"));
  try {
    const rows = (await api("GET", `/api/triggers/${t.id}/deliveries?limit=20`)).results;
    put(target, ...(rows.length
      ? rows.map((d) => el("li", {},
          el("time", { datetime: d.receivedAt }, when(d.receivedAt)), " ",
          el("code", { class: "delivery-id", title: d.delivery }, d.delivery.length > 40 ? `${d.delivery.slice(0, 40)}…` : d.delivery), " ",
          d.task ? taskLink(d.task, d.taskTitle ?? `task ${d.task}`) : el("span", { class: "hint" }, "no task"),
          d.taskState ? el("span", { class: `badge state-${d.taskState}` }, d.taskState) : null))
      : [el("li", { class: "empty" }, "No deliveries yet.")]));
  } catch (err) {
    put(target, el("li", { class: "error" }, err.message));
  }
}

async function change(t, verb, message) {
  await api("POST", `/api/triggers/${t.id}/${verb}`);
  await load(t.kind);
  say(message);
}

async function remove(t) {
  const what = t.kind === "webhook" ? "Its address stops working at once." : "The folder is no longer watched.";
  if (!(await confirmThen(`Delete ${t.name}?`, `${what} Tasks it already started stay.`, `Delete ${t.name}`))) return;
  await api("DELETE", `/api/triggers/${t.id}`);
  await load(t.kind);
  say(`Deleted ${t.name}`);
}

async function rotate(t) {
  const yes = await confirmThen(`Rotate the secret of ${t.name}?`,
    "The box makes a new secret and shows it once. The current one keeps working for a day, or until you finish the rotation, so you can update the sender first.",
    "Make a new secret");
  if (!yes) return;
  const rotated = await api("POST", `/api/triggers/${t.id}/rotate`, {});
  showSecretOnce(`New secret for ${rotated.name}`, rotated);
  await load("webhook");
}

async function finishRotation(t) {
  await api("POST", `/api/triggers/${t.id}/rotate/finish`);
  await load("webhook");
  say(`Only the new secret of ${t.name} works now`);
}

// --- the secret, shown once ------------------------------------------------------------------
function showSecretOnce(heading, trigger) {
  const box = $("secret-once");
  $("secret-once-heading").textContent = heading;
  $("once-url").value = trigger.url;
  $("once-secret").value = trigger.secret;
  box.hidden = false;
  box.focus();
}

$("secret-done").addEventListener("click", () => {
  // Forget it: the page keeps no copy once the owner says it is saved.
  $("once-url").value = "";
  $("once-secret").value = "";
  $("secret-once").hidden = true;
  $("trigger-name").focus();
});

for (const button of document.querySelectorAll("[data-copy]")) {
  button.addEventListener("click", async () => {
    const input = $(button.dataset.copy);
    try {
      await navigator.clipboard.writeText(input.value);
    } catch (err) {
      // No clipboard permission (an http:// address that is not this machine): select it for Ctrl+C.
      input.select();
      say("Selected: press Ctrl+C to copy");
      return;
    }
    say("Copied");
  });
}

// --- the form -------------------------------------------------------------------------------
function syncKind() {
  const kind = form.elements.kind.value;
  for (const box of form.querySelectorAll("[data-kind]")) box.hidden = box.dataset.kind !== kind;
}
form.addEventListener("change", () => { syncKind(); syncWorker(form); });
syncKind();
syncWorker(form);

function bodyFrom() {
  const kind = form.elements.kind.value;
  const body = { kind, name: value("name").value.trim(), template: templateFrom(form) };
  if (kind === "webhook") {
    if (value("secret").value) body.secret = value("secret").value;
  } else {
    body.folder = value("folder").value.trim();
    if (value("settleSeconds").value !== "") body.settleSeconds = Number(value("settleSeconds").value);
  }
  return body;
}

submitWith(form, $("trigger-submit"), bodyFrom, (body) => api("POST", "/api/triggers", body), async (created) => {
  const kind = created.kind;
  form.reset();
  syncKind();
  syncWorker(form);
  await load(kind);
  if (kind === "webhook") showSecretOnce(`Webhook ${created.name} is ready`, created);
  else say(`Watching ${created.folder}`);
});

load("webhook");
load("file");
