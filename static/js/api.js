// Talking to the box's API from the pages: session (or device) cookie + the CSRF token.
// Errors come back as {code, message, field}; showError puts the message next to the field.

const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content ?? "";

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message ?? `the box answered ${status}`);
    this.status = status;
    this.code = body?.code ?? "ERROR";
    this.field = body?.field ?? null;
    this.body = body ?? {};
  }
}

export async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (method !== "GET") init.headers["X-CSRFToken"] = csrf();
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, { code: "OFFLINE", message: "the box cannot be reached; check the connection" });
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { message: text.slice(0, 200) }; }
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// Small DOM builder: text always goes in as text, never as HTML.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replaceChildren() would print a skipped (null) child as the text "null"; this drops them.
export function put(node, ...children) {
  node.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined && child !== false));
}

// Replaces a list's rows as put does, and opens again each <details> that was open in the row it
// replaces (rows matched by their ``data-<key>`` attribute, details by their order in the row):
// a list read again after an action does not fold what the person had opened to read. Opening
// one fires its "toggle" listener, which reads its content afresh.
export function putKeepingOpen(list, key, rows) {
  const open = new Set();
  for (const row of list.children) {
    row.querySelectorAll("details").forEach((details, i) => { if (details.open) open.add(`${row.dataset[key]}/${i}`); });
  }
  put(list, ...rows);
  for (const row of list.children) {
    row.querySelectorAll("details").forEach((details, i) => { if (open.has(`${row.dataset[key]}/${i}`)) details.open = true; });
  }
}

export function clearErrors(form) {
  for (const p of form.querySelectorAll("[data-error-for]")) { p.hidden = true; p.textContent = ""; }
  for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
}

// The API names the field it refuses ("hosts", "limits.max_actions", "flow"); show the message
// next to that field, or at the top of the form when the form has no such field.
export function showError(form, err) {
  const field = err.field ?? "";
  const candidates = [field, field.split(".")[0], ""];
  let target = null;
  for (const name of candidates) {
    target = form.querySelector(`[data-error-for="${CSS.escape(name)}"]`);
    if (target) break;
  }
  const message = forPeople(form, err.message || "that did not work");
  if (target) {
    target.textContent = message;
    target.hidden = false;
    target.setAttribute("role", "alert");
  }
  const input = field && form.querySelector(`[name="${CSS.escape(field.split(".")[0])}"]`);
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.focus();
  }
  if (!target) say(message);
}

// API messages name a field the way the API spells it ("'title' must not be empty"); a person
// reads the label they see on the form ("Title must not be empty").
function forPeople(form, message) {
  const named = message.replace(/'([A-Za-z_][\w.]*)'/g, (whole, name) => {
    const input = form.querySelector(`[name="${CSS.escape(name)}"]`) ?? form.querySelector(`[name="${CSS.escape(name.split(".")[0])}"]`);
    const label = input?.labels?.[0]?.textContent?.trim();
    return label || name.replaceAll(".", " ").replaceAll("_", " ");
  });
  return named.charAt(0).toUpperCase() + named.slice(1);
}

export function say(message) {
  const status = document.getElementById("live-status");
  if (status) {
    status.textContent = message;
    status.classList.add("shown");
    clearTimeout(say.timer);
    say.timer = setTimeout(() => status.classList.remove("shown"), 6000);
  }
}

export function cents(value) {
  const n = Number(value || 0);
  return n >= 100 ? `$${(n / 100).toFixed(2)}` : `${n}¢`;
}

export function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

export function time(iso) {
  return iso ? new Date(iso).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" }) : "";
}

export function initialData(id = "initial") {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}

export async function refreshInboxCount() {
  const badge = document.getElementById("inbox-count");
  if (!badge) return;
  try {
    const inbox = await api("GET", "/api/inbox");
    const count = inbox.approvals.length + inbox.questions.length;
    badge.textContent = String(count);
    badge.setAttribute("aria-label", `${count} waiting for you`);
    badge.hidden = count === 0;
  } catch (err) {
    // The count is a convenience; the inbox page itself shows any error.
  }
}
