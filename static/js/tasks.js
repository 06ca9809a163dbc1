// The Tasks page: the live list and the New task form.
import { api, clearErrors, initialData, refreshInboxCount, say, showError } from "./api.js";
import { ListStream } from "./live.js";
import { upsertRow } from "./render.js";

const data = initialData();
const list = document.getElementById("task-list");
const empty = document.getElementById("no-tasks");

function showEmpty() {
  empty.hidden = list.children.length > 0;
}

for (const task of [...data.tasks].reverse()) upsertRow(list, task);
showEmpty();

// --- filters and search: the API answers the list; live updates keep only matching rows ------
const filters = document.getElementById("task-filters");
function filterValues() {
  return { q: filters.elements.q.value.trim(), state: filters.elements.state.value };
}
function matches(task) {
  const { q, state } = filterValues();
  if (state && !state.split(",").includes(task.state)) return false;
  const text = `${task.title} ${task.prompt ?? ""}`.toLowerCase();
  return q.toLowerCase().split(/\s+/).filter(Boolean).every((word) => text.includes(word));
}
let filterTimer = null;
async function applyFilters() {
  const { q, state } = filterValues();
  const params = new URLSearchParams({ limit: "50" });
  if (q) params.set("q", q);
  if (state) params.set("state", state);
  try {
    const page = await api("GET", `/api/tasks?${params}`);
    list.replaceChildren();
    for (const task of [...page.results].reverse()) upsertRow(list, task);
    empty.textContent = q || state ? "No task matches." : "No tasks yet. Start one with the form.";
    showEmpty();
  } catch (err) {
    showError(filters, err);
  }
}
filters.addEventListener("input", () => { clearTimeout(filterTimer); filterTimer = setTimeout(applyFilters, 250); });
filters.addEventListener("change", () => { clearTimeout(filterTimer); applyFilters(); });
filters.addEventListener("submit", (event) => { event.preventDefault(); applyFilters(); });

// The inbox count changes only when a task starts or stops waiting: ask for it then, once per
// burst of live events, not once per event.
const waiting = new Map(data.tasks.map((t) => [t.id, t.state === "waiting"]));
let countTimer = null;
new ListStream({
  cursor: data.cursor,
  onTask: (task) => {
    if (matches(task)) upsertRow(list, task);
    else list.querySelector(`[data-task="${CSS.escape(task.id)}"]`)?.remove();
    showEmpty();
    const now = task.state === "waiting";
    if (waiting.get(task.id) !== now) {
      waiting.set(task.id, now);
      clearTimeout(countTimer);
      countTimer = setTimeout(refreshInboxCount, 250);
    }
  },
}).start();

// --- the New task form ---------------------------------------------------------------------
const form = document.getElementById("new-task");

function syncVisibility() {
  const target = form.elements.target.value;
  for (const box of form.querySelectorAll("[data-target]")) box.hidden = box.dataset.target !== target;
  const worker = form.elements.worker.value;
  for (const box of form.querySelectorAll("[data-worker]")) box.hidden = box.dataset.worker !== worker;
}
form.addEventListener("change", syncVisibility);
syncVisibility();

function listOf(text, separator) {
  return text.split(separator).map((s) => s.trim()).filter(Boolean);
}

function specFrom(form) {
  const f = form.elements;
  const spec = { title: f.title.value.trim() };
  if (f.prompt.value.trim()) spec.prompt = f.prompt.value;
  if (f.target.value === "folders") spec.folders = listOf(f.folders.value, /\n/);
  else spec.workspace = f.workspace.value;
  spec.worker = f.worker.value;
  if (spec.worker === "command") spec.command = f.command.value;
  if (spec.worker === "flow" && f.flow.value.trim()) {  // empty: the box's model plans the steps
    try {
      spec.flow = JSON.parse(f.flow.value || "null");
    } catch (err) {
      throw { field: "flow", message: `the steps are not valid JSON: ${err.message}` };
    }
  }
  spec.hosts = listOf(f.hosts.value, /[\s,]+/);
  if (f.budgetCents.value !== "") {
    const budget = Number(f.budgetCents.value);
    if (!Number.isInteger(budget)) throw { field: "budgetCents", message: "the budget is a whole number of cents" };
    spec.budgetCents = budget;
  }
  spec.tools = [...form.querySelectorAll('input[name="tools"]:checked')].map((box) => box.value);
  return spec;
}

// --- Run again: the form filled from an ended task; its facts, constraints and limits (secret
// facts too, which the page never sees) come from that task on the server.
let again = new URLSearchParams(window.location.search).get("again");

function shellWord(word) {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`;
}

async function fillFrom(taskId) {
  const t = await api("GET", `/api/tasks/${encodeURIComponent(taskId)}`);
  const f = form.elements;
  f.title.value = t.title;
  f.prompt.value = t.prompt ?? "";
  f.target.value = t.folders?.length ? "folders" : "workspace";
  if (t.folders?.length) f.folders.value = t.folders.join("\n");
  else f.workspace.value = t.workspace;
  f.worker.value = t.worker;
  f.command.value = (t.command ?? []).map(shellWord).join(" ");
  f.flow.value = t.flow ? JSON.stringify(t.flow, null, 2) : "";
  f.hosts.value = (t.hosts ?? []).join(", ");
  f.budgetCents.value = String(t.budgetCents ?? 0);
  for (const box of form.querySelectorAll('input[name="tools"]')) box.checked = (t.tools ?? []).includes(box.value);
  syncVisibility();
  const note = document.getElementById("again-note");
  note.textContent = `Running “${t.title}” again: edit anything below. Its facts${t.secretFacts?.length ? " (secret ones too)" : ""}, constraints and limits come along.`;
  note.hidden = false;
  form.querySelector('button[type="submit"]').textContent = "Run it again";
  f.title.focus();
}

function leaveAgain() {
  again = null;
  document.getElementById("again-note").hidden = true;
  form.querySelector('button[type="submit"]').textContent = "Start the task";
  window.history.replaceState(null, "", "/tasks");
}

if (again) fillFrom(again).catch((err) => { leaveAgain(); say(err.message); });

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(form);
  const button = form.querySelector('button[type="submit"]');
  let spec;
  try {
    spec = specFrom(form);
  } catch (err) {
    showError(form, err);
    return;
  }
  button.disabled = true;
  try {
    const task = again ? await api("POST", `/api/tasks/${encodeURIComponent(again)}/rerun`, spec) : await api("POST", "/api/tasks", spec);
    if (again) leaveAgain();
    upsertRow(list, task);
    showEmpty();
    say(`Started “${task.title}”`);
    form.elements.title.value = "";
    form.elements.prompt.value = "";
    list.querySelector(`[data-task="${CSS.escape(task.id)}"] a`)?.focus();
  } catch (err) {
    showError(form, err);
  } finally {
    button.disabled = false;
  }
});
