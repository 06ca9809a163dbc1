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

new ListStream({
  cursor: data.cursor,
  onTask: (task) => {
    upsertRow(list, task);
    showEmpty();
    if (task.state === "waiting" || task.waitingFor === null) refreshInboxCount();
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
  if (spec.worker === "flow") {
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
    const task = await api("POST", "/api/tasks", spec);
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
