// Pieces the Schedules and Triggers pages share: the task-template fields, errors placed next to
// the field the API names ("cron", "template.hosts"), cadence in words, and submitting a form.
import { clearErrors, el, showError } from "./api.js";

const field = (form, name) => form.querySelector(`[data-field="${CSS.escape(name)}"]`);

function listOf(text, separator) {
  return text.split(separator).map((s) => s.trim()).filter(Boolean);
}

// Show the worker's own fields (command, flow steps) and hide the others.
export function syncWorker(form) {
  const worker = field(form, "template.worker").value;
  for (const box of form.querySelectorAll("[data-worker]")) box.hidden = box.dataset.worker !== worker;
}

// The task spec the template fields describe. Throws {field, message} for input the browser can
// already tell is wrong (JSON that does not parse); everything else is the API's to judge.
export function templateFrom(form) {
  const value = (name) => field(form, name)?.value ?? "";
  const spec = { title: value("template.title").trim() };
  if (value("template.prompt").trim()) spec.prompt = value("template.prompt");
  if (value("template.workspace")) spec.workspace = value("template.workspace");
  spec.worker = value("template.worker");
  if (spec.worker === "command") spec.command = value("template.command");
  if (spec.worker === "flow") {
    try {
      spec.flow = JSON.parse(value("template.flow") || "null");
    } catch (err) {
      throw { field: "template.flow", message: `the steps are not valid JSON: ${err.message}` };
    }
  }
  spec.hosts = listOf(value("template.hosts"), /[\s,]+/);
  if (value("template.budgetCents") !== "") {
    const budget = Number(value("template.budgetCents"));
    if (!Number.isInteger(budget)) throw { field: "template.budgetCents", message: "the budget is a whole number of cents" };
    spec.budgetCents = budget;
  }
  spec.tools = [...form.querySelectorAll('[data-field="template.tools"]:checked')].map((box) => box.value);
  return spec;
}

// Put a saved template back into the fields (editing). Fields the form does not have (facts,
// limits) are kept by the caller, which sends them back unchanged.
export function fillTemplate(form, template) {
  const set = (name, value) => { const input = field(form, name); if (input) input.value = value ?? ""; };
  set("template.title", template.title);
  set("template.prompt", template.prompt);
  if (template.workspace) set("template.workspace", template.workspace);
  set("template.worker", template.worker ?? "agent");
  set("template.command", Array.isArray(template.command) ? template.command.join(" ") : template.command);
  set("template.flow", template.flow ? JSON.stringify(template.flow, null, 2) : "");
  set("template.hosts", (template.hosts ?? []).join(", "));
  set("template.budgetCents", template.budgetCents ?? "");
  for (const box of form.querySelectorAll('[data-field="template.tools"]')) box.checked = (template.tools ?? []).includes(box.value);
  syncWorker(form);
}

// The API's {message} next to the field it names, and aria-invalid on that field's input.
export function showFieldError(form, err) {
  showError(form, err);
  const name = err.field ?? "";
  const input = name && (field(form, name) ?? field(form, name.split(".").slice(0, 2).join(".")));
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.focus();
  }
}

// --- cadence in words -------------------------------------------------------------------------
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
const isNumber = (s) => /^\d+$/.test(s);
const isMinute = (s) => isNumber(s) && Number(s) <= 59;
const isHour = (s) => isNumber(s) && Number(s) <= 23;
const clock = (h, m) => `${String(h).padStart(2, "0")}:${String(m).padStart(2, "0")}`;

export function intervalWords(seconds) {
  for (const [size, unit] of [[86400, "day"], [3600, "hour"], [60, "minute"]]) {
    if (seconds % size === 0) {
      const n = seconds / size;
      return n === 1 ? `every ${unit}` : `every ${plural(n, unit)}`;
    }
  }
  return `every ${plural(seconds, "second")}`;
}

function daysWords(dow) {
  if (dow === "*") return "every day";
  if (dow === "1-5" || dow.toUpperCase() === "MON-FRI") return "on weekdays";
  if (dow === "0,6" || dow === "6,0") return "at weekends";
  if (/^[0-7](,[0-7])*$/.test(dow)) return `on ${dow.split(",").map((d) => DAYS[Number(d)]).join(", ")}`;
  return null;
}

// The common shapes of a cron expression in words; anything else is called what it is.
export function cronWords(cron) {
  const parts = (cron ?? "").trim().split(/\s+/);
  if (parts.length !== 5) return null;
  const [min, hour, dom, month, dow] = parts;
  const step = (s) => (/^\*\/(\d+)$/.exec(s) ?? [])[1];
  if (dom === "*" && month === "*" && dow === "*") {
    if (min === "*" && hour === "*") return "every minute";
    if (step(min) && hour === "*") return `every ${plural(Number(step(min)), "minute")}`;
    if (isMinute(min) && hour === "*") return `every hour at ${String(min).padStart(2, "0")} past`;
    if (isMinute(min) && step(hour)) return `every ${plural(Number(step(hour)), "hour")} at ${String(min).padStart(2, "0")} past`;
  }
  if (isMinute(min) && isHour(hour) && month === "*") {
    const at = clock(Number(hour), Number(min));
    if (dom === "*") {
      const days = daysWords(dow);
      if (days) return `${days} at ${at}`;
    } else if (isNumber(dom) && dow === "*") {
      return `on day ${dom} of every month at ${at}`;
    }
  }
  return null;
}

export function cadenceWords(schedule) {
  if (schedule.intervalSeconds) return intervalWords(schedule.intervalSeconds);
  return cronWords(schedule.cron) ?? "on a custom cron schedule";
}

// --- submitting -------------------------------------------------------------------------------
// On submit: clear old errors and build the body (a bad field is shown next to it and nothing is
// sent); then send it with `button` disabled and hand the saved row to `done`. A refusal from the
// API is shown next to the field it names.
export function submitWith(form, button, bodyFrom, send, done) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    let body;
    try {
      body = bodyFrom();
    } catch (err) {
      showFieldError(form, err);
      return;
    }
    button.disabled = true;
    try {
      await done(await send(body));
    } catch (err) {
      showFieldError(form, err);
    } finally {
      button.disabled = false;
    }
  });
}

// A button that runs an API call, disabled while it does, reporting failure in the live region.
export function actionButton(label, cls, run, say) {
  const button = el("button", { type: "button", class: `small ${cls ?? ""}`.trim() }, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try { await run(); } catch (err) { say(err.message); } finally { button.disabled = false; }
  });
  return button;
}
