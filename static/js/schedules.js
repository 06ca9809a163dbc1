// The Schedules page: the filtered, paged list, the New/Edit form, pause/resume/delete, and each
// schedule's recent firings (with the skipped count of a catch-up) linking to their tasks.
import { api, clearErrors, el, put, putKeepingOpen, say, when } from "./api.js";
import { confirmThen } from "./render.js";
import {
  actionButton, cadenceWords, cronWords, fillTemplate, showFieldError, submitWith, syncWorker, templateFrom,
} from "./schedule-forms.js";

const $ = (id) => document.getElementById(id);
const list = $("schedule-list");
const filters = $("filters");
const more = $("more");
const form = $("schedule-form");
let nextCursor = null;
let editing = null; // the schedule being edited, or null for a new one

const STATUS_WORDS = { active: "active", paused: "paused", disabled: "disabled", attention: "needs attention" };
const ORIGIN_WORDS = { owner: "you", device: "a phone", task: "a task", system: "the box (built in)" };

// --- the list -------------------------------------------------------------------------------
function query(cursor) {
  const params = new URLSearchParams();
  for (const name of ["status", "origin", "enabled", "sort"]) {
    const value = filters.elements[name].value;
    if (value) params.set(name, value);
  }
  params.set("limit", "20");
  if (cursor) params.set("cursor", cursor);
  return `/api/schedules?${params}`;
}

async function load({ append = false } = {}) {
  clearErrors(filters);
  try {
    const page = await api("GET", query(append ? nextCursor : null));
    const rows = page.results.map(scheduleRow);
    if (append) list.append(...rows); else putKeepingOpen(list, "schedule", rows);
    nextCursor = page.next;
    more.hidden = !nextCursor;
    $("no-schedules").hidden = list.children.length > 0;
  } catch (err) {
    showFieldError(filters, err);
  }
}

function taskLink(id, text) {
  return id ? el("a", { href: `/tasks/${encodeURIComponent(id)}` }, text ?? id) : null;
}

function fact(label, ...value) {
  return el("div", {}, el("dt", {}, label), el("dd", {}, ...value));
}

function cadenceLine(s) {
  const raw = s.cron
    ? [el("code", {}, s.cron), ` · ${s.timezone}`]
    : [el("code", {}, `every ${s.intervalSeconds} s`)];
  return el("p", { class: "cadence" }, el("span", { class: "words" }, cadenceWords(s)), " ", el("span", { class: "raw" }, "(", ...raw, ")"));
}

function scheduleRow(s) {
  const actions = [];
  if (s.status === "paused" || s.status === "disabled") {
    actions.push(actionButton(s.enabled ? "Resume" : "Enable again", "primary", () => change(s, "resume", s.enabled ? `Resumed ${s.name}` : `Enabled ${s.name} again`), say));
  } else {
    actions.push(actionButton("Pause", "", () => change(s, "pause", `Paused ${s.name}`), say));
  }
  if (!s.template?.job) actions.push(actionButton("Run now", "", () => runNow(s), say));  // a built-in job starts no task
  if (!s.system) {
    actions.push(actionButton("Edit", "", async () => startEditing(s), say));
    actions.push(actionButton("Delete", "danger", () => remove(s), say));
  }
  for (const button of actions) button.setAttribute("aria-label", `${button.textContent} ${s.name}`);

  const firings = el("ol", { class: "firings", "aria-label": `Recent firings of ${s.name}` });
  const details = el("details", { class: "firings-box" }, el("summary", {}, "Recent firings"), firings);
  details.addEventListener("toggle", () => { if (details.open) loadFirings(s, firings); });

  const problem = s.status === "disabled"
    ? el("p", { class: "alert" }, el("strong", {}, "Disabled: "), s.disabledReason ?? "by the box")
    : s.needsAttention
      ? el("p", { class: "alert" }, el("strong", {}, "Needs attention: "), s.lastError ?? "its firings keep failing")
      : s.lastError && s.consecutiveFailures
        ? el("p", { class: "alert" }, el("strong", {}, "Last firing failed: "), s.lastError)
        : null;

  return el("li", { class: "sched-row", "data-schedule": String(s.id) },
    el("div", { class: "task-row-head" },
      el("h3", { class: "task-title" }, s.name),
      el("span", {},
        s.system ? el("span", { class: "badge" }, "built in") : null, " ",
        el("span", { class: `badge status-${s.status}` }, STATUS_WORDS[s.status] ?? s.status))),
    cadenceLine(s),
    problem,
    el("dl", { class: "facts" },
      fact("Next run", s.nextRunAt ? el("time", { datetime: s.nextRunAt }, when(s.nextRunAt)) : (s.status === "active" || s.status === "attention" ? "—" : "not while " + (STATUS_WORDS[s.status] ?? s.status))),
      fact("Last run", s.lastRunAt ? el("time", { datetime: s.lastRunAt }, when(s.lastRunAt)) : "never",
        s.lastTask ? [" · ", taskLink(s.lastTask, "its task")] : null),
      fact("Failures in a row", String(s.consecutiveFailures),
        s.backoffUntil ? ` · retrying after ${when(s.backoffUntil)}` : null),
      fact("Made by", ORIGIN_WORDS[s.origin] ?? s.origin,
        s.createdByTask ? [" · ", taskLink(s.createdByTask, `task ${s.createdByTask}`), s.createdByRun ? `, run ${s.createdByRun}` : null] : null),
      fact("Starts", el("span", { class: "template-title" }, s.template?.title ?? ""))),
    el("div", { class: "buttons" }, actions),
    details);
}

async function loadFirings(s, target) {
  put(target, el("li", { class: "empty" }, "Loading…"));
  try {
    const firings = (await api("GET", `/api/schedules/${s.id}/firings?limit=20`)).results;
    put(target, ...(firings.length ? firings.map(firingRow) : [el("li", { class: "empty" }, "It has not fired yet.")]));
  } catch (err) {
    put(target, el("li", { class: "error" }, err.message));
  }
}

function firingRow(f) {
  const skipped = f.skipped
    ? el("span", { class: "badge status-paused" }, `catch-up: ${f.skippedAtLeast ? "at least " : ""}${f.skipped} missed skipped`)
    : null;
  return el("li", {},
    el("time", { datetime: f.firedAt }, when(f.firedAt)), " ",
    skipped, " ",
    f.task ? [taskLink(f.task, f.taskTitle ?? `task ${f.task}`), " ",
      f.taskState ? el("span", { class: `badge state-${f.taskState}` }, f.taskState) : null]
      : f.error ? el("span", { class: "error" }, `failed: ${f.error}`)
        : el("span", {}, "ran (a built-in job)"));
}

async function runNow(s) {
  const task = await api("POST", `/api/schedules/${s.id}/run`);
  await load();
  say(`Started “${task.title}” from ${s.name}`);
}

async function change(s, verb, message) {
  await api("POST", `/api/schedules/${s.id}/${verb}`);
  await load();
  say(message);
}

async function remove(s) {
  const yes = await confirmThen(`Delete ${s.name}?`, "It stops firing and is gone for good. Tasks it already started stay.", `Delete ${s.name}`);
  if (!yes) return;
  await api("DELETE", `/api/schedules/${s.id}`);
  if (editing?.id === s.id) stopEditing();
  await load();
  say(`Deleted ${s.name}`);
}

filters.addEventListener("change", () => load());
filters.addEventListener("submit", (event) => { event.preventDefault(); load(); });
more.addEventListener("click", () => load({ append: true }));

// --- the form -------------------------------------------------------------------------------
const value = (name) => form.querySelector(`[data-field="${name}"]`);

function syncCadence() {
  const kind = form.elements.cadence.value;
  for (const box of form.querySelectorAll("[data-cadence]")) box.hidden = box.dataset.cadence !== kind;
}

function showCronWords() {
  const words = cronWords(value("cron").value);
  $("cron-words").textContent = words
    ? `That is ${words}.`
    : "Five fields: minute hour day month weekday. 0 9 * * 1-5 is 09:00 on weekdays.";
}

form.addEventListener("change", () => { syncCadence(); syncWorker(form); });
value("cron").addEventListener("input", showCronWords);
syncCadence();
syncWorker(form);
// A new schedule starts on this browser's own clock.
const ownZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
if (ownZone) value("timezone").value = ownZone;

function bodyFrom() {
  const body = { name: value("name").value.trim() };
  if (form.elements.cadence.value === "cron") {
    body.cron = value("cron").value.trim();
    body.timezone = value("timezone").value.trim() || "UTC";
  } else {
    const every = Number(value("intervalSeconds").value);
    if (!Number.isInteger(every) || every < 1) throw { field: "intervalSeconds", message: "a whole number, please" };
    body.intervalSeconds = every * Number($("schedule-unit").value);
  }
  // An unchanged cadence is left out: sending it would restart the cursor from now.
  if (editing && (body.cron ?? null) === editing.cron && (body.intervalSeconds ?? null) === editing.intervalSeconds
      && (body.timezone ?? null) === editing.timezone) {
    delete body.cron;
    delete body.timezone;
    delete body.intervalSeconds;
  }
  // Keep what the form does not show (facts, limits, ...) when editing.
  body.template = { ...(editing ? stripShown(editing.template) : {}), ...templateFrom(form) };
  if (editing) body.version = editing.version;
  return body;
}

function stripShown(template) {
  const rest = { ...template };
  for (const key of ["title", "prompt", "workspace", "worker", "command", "flow", "hosts", "budgetCents", "tools"]) delete rest[key];
  return rest;
}

function startEditing(s) {
  editing = s;
  clearErrors(form);
  $("schedule-form-heading").textContent = `Edit ${s.name}`;
  $("schedule-submit").textContent = "Save changes";
  $("schedule-cancel-edit").hidden = false;
  value("name").value = s.name;
  form.elements.cadence.value = s.cron ? "cron" : "interval";
  if (s.cron) {
    value("cron").value = s.cron;
    value("timezone").value = s.timezone;
  } else {
    const unit = [86400, 3600, 60].find((size) => s.intervalSeconds % size === 0) ?? 60;
    $("schedule-unit").value = String(unit);
    value("intervalSeconds").value = String(s.intervalSeconds / unit);
  }
  fillTemplate(form, s.template ?? {});
  syncCadence();
  showCronWords();
  value("name").focus();
}

function stopEditing() {
  editing = null;
  form.reset();
  clearErrors(form);
  if (ownZone) value("timezone").value = ownZone;
  $("schedule-form-heading").textContent = "New schedule";
  $("schedule-submit").textContent = "Create schedule";
  $("schedule-cancel-edit").hidden = true;
  syncCadence();
  syncWorker(form);
  showCronWords();
}

$("schedule-cancel-edit").addEventListener("click", stopEditing);

submitWith(
  form,
  $("schedule-submit"),
  bodyFrom,
  (body) => (editing ? api("PATCH", `/api/schedules/${editing.id}`, body) : api("POST", "/api/schedules", body)),
  async (saved) => {
    const said = editing ? `Saved ${saved.name}` : `Created ${saved.name}: ${cadenceWords(saved)}`;
    stopEditing();
    await load();
    say(said);
    list.querySelector(`[data-schedule="${saved.id}"] h3`)?.scrollIntoView({ block: "nearest" });
  },
);

load();
