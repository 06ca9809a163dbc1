// The phone page: one box to ask, what waits for the owner, and the recent tasks, all live.
import { api, initialData, say, showError, clearErrors } from "./api.js";
import { loadInbox } from "./inbox.js";
import { ListStream, statusBadge } from "./live.js";
import { upsertRow } from "./render.js";

const data = initialData();
const list = document.getElementById("task-list");
const inbox = document.getElementById("phone-inbox");

async function showInbox() {
  try {
    document.getElementById("phone-inbox-empty").hidden = (await loadInbox(inbox, { big: true })) > 0;
  } catch (err) {
    say(err.message);
  }
}

async function showTasks() {
  const page = await api("GET", "/api/tasks?limit=20");
  for (const task of [...page.results].reverse()) upsertRow(list, task, { href: null, phone: true });
  document.getElementById("no-tasks").hidden = list.children.length > 0;
}

let timer = null;
new ListStream({
  cursor: data.cursor,
  onTask: (task) => {
    upsertRow(list, task, { href: null, phone: true });
    document.getElementById("no-tasks").hidden = true;
    clearTimeout(timer);
    timer = setTimeout(showInbox, 150);
  },
  onStatus: statusBadge(document.getElementById("stream-status")),
}).start();
showTasks().catch((err) => say(err.message));
showInbox();
// The stream follows this phone's own tasks; approvals of the owner's other tasks reach the
// phone's inbox too, so it is also re-read every few seconds while the page is in view.
setInterval(() => { if (document.visibilityState === "visible") showInbox(); }, 5000);

const form = document.getElementById("ask");
form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(form);
  const prompt = form.elements.prompt.value.trim();
  if (!prompt) {
    showError(form, { field: "prompt", message: "Type what the box should do." });
    return;
  }
  const firstLine = prompt.split("\n")[0];
  const title = firstLine.length > 80 ? `${firstLine.slice(0, 79)}…` : firstLine;
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const task = await api("POST", "/api/tasks", { title, prompt });
    upsertRow(list, task, { href: null, phone: true });
    document.getElementById("no-tasks").hidden = true;
    form.reset();
    say(`Asked: ${task.title}`);
  } catch (err) {
    showError(form, err);
  } finally {
    button.disabled = false;
  }
});
