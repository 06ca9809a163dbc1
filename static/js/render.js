// Pieces several pages draw: task rows, state badges, approval and question cards, the confirm
// dialog (its markup is templates/_confirm.html).
import { api, cents, clearErrors, el, put, say, showError, when } from "./api.js";
import { BrowserView } from "./browser-view.js";

const PAUSE_WORDS = {
  input: "waiting for values",
  approval: "waiting for your OK",
  checkpoint: "waiting at a checkpoint",
  human: "waiting for a person",
  plan: "waiting for a plan",
};

export function stateText(task) {
  if (task.state === "waiting" && task.waitingFor) return PAUSE_WORDS[task.waitingFor] ?? `waiting for ${task.waitingFor}`;
  if (task.review === "pending") return "done · review";
  if (task.review === "conflict") return "done · conflict";
  return task.state;
}

export function stateBadge(task) {
  return el("span", { class: `badge state-${task.state}${task.review ? ` review-${task.review}` : ""}`, "data-state": task.state }, stateText(task));
}

export function progressBar(task, label) {
  const value = Math.round((task.progress ?? 0) * 100);
  return el("progress", { max: "100", value: String(value), "aria-label": label ?? `Progress of ${task.title}`, title: `${value}%` });
}

export function costText(task) {
  return task.budgetCents ? `${cents(task.costCents)} of ${cents(task.budgetCents)}` : `${cents(task.costCents)} (no budget)`;
}

// On the phone a row is the whole story: why a waiting task cannot go on, what the owner can do,
// and Cancel (asked twice, in place), since the phone has no task window of its own.
function phoneDetails(task) {
  const parts = [];
  if (task.state === "waiting" && task.pause?.message) parts.push(el("p", { class: "pause" }, task.pause.message));
  if (task.state === "waiting" && task.waitingFor === "plan") {
    parts.push(el("p", { class: "hint" }, "The owner can configure a model on the box (",
      el("a", { href: "/settings#model-heading" }, "Settings → Model"), "), or start it again as steps. "
      + "While it waits it takes no worker and no task slot; cancel it if it is not wanted."));
  }
  if ((task.next ?? []).includes("cancel")) parts.push(cancelControl(task));
  if ((task.next ?? []).includes("retry")) parts.push(retryForm(task, { big: true }));
  return parts.length ? el("div", { class: "phone-details" }, ...parts) : null;
}

// A recoverable failure goes on from the step that failed (POST /api/tasks/<id>/retry). When
// the failure names the limit it ran out of, the owner may raise it first; the box refuses a
// lower value, and any refusal shows here, under the button.
export function retryForm(task, { big = false, onDone = null } = {}) {
  const named = /limits\.([a-z_]+)/.exec(`${task.hint ?? ""} ${task.error ?? ""}`);
  const limit = named ? named[1] : null;
  const current = limit ? task.limits?.[limit] : null;
  const inputId = `retry-${task.id}-limit`;
  const input = limit ? el("input", { type: "number", id: inputId, name: "raise", min: "1", step: "1", inputmode: "numeric",
    placeholder: current == null ? "" : `now ${current}` }) : null;
  const button = el("button", { type: "submit", class: `primary${big ? " big" : ""}`, "data-verb": "retry" }, "Retry");
  const error = el("p", { class: "alert", "data-error-for": "", hidden: true });
  const form = el("form", { class: "retry-form", "aria-label": `Retry “${task.title}”` },
    input ? el("label", { for: inputId }, `Raise ${limit} to`) : null, input, button, error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const body = {};
    if (input && input.value.trim() !== "") body.limits = { [limit]: Number(input.value) };
    button.disabled = true;
    try {
      const updated = await api("POST", `/api/tasks/${task.id}/retry`, body);
      say(`Retrying “${task.title}” from the step that failed`);
      onDone?.(updated);
    } catch (err) {
      showError(form, err);
      button.disabled = false;
    }
  });
  return form;
}

function cancelControl(task) {
  const box = el("div", { class: "buttons" });
  const ask = el("button", { type: "button", class: "danger big" }, "Cancel");
  ask.addEventListener("click", () => {
    const yes = el("button", { type: "button", class: "danger big" }, "Yes, cancel it");
    const no = el("button", { type: "button", class: "big" }, "Keep it");
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      try {
        await api("POST", `/api/tasks/${task.id}/cancel`, {});
        say(`Cancelled “${task.title}”`);
      } catch (err) {
        say(err.message);
        yes.disabled = false;
      }
    });
    no.addEventListener("click", () => { put(box, ask); ask.focus(); });
    put(box, el("span", { class: "confirm-text" }, "Cancel this task?"), yes, no);
    yes.focus();
  });
  box.append(ask);
  return box;
}

export function taskRow(task, { href = `/tasks/${task.id}`, phone = false } = {}) {
  return el("li", { class: "task-row", "data-task": task.id, "data-seq": String(task.lastSeq ?? 0) },
    el("div", { class: "task-row-head" },
      href ? el("a", { href, class: "task-title" }, task.title) : el("span", { class: "task-title" }, task.title),
      stateBadge(task)),
    el("p", { class: "task-step" }, task.error ? `Error: ${task.error}` : task.answer ? `Answer: ${task.answer}` : (task.step || "\u00a0")),
    el("div", { class: "task-row-foot" },
      progressBar(task),
      el("span", { class: "cost" }, costText(task)),
      el("span", { class: "source" }, task.source),
      el("time", { datetime: task.createdAt }, when(task.createdAt))),
    phone ? phoneDetails(task) : null);
}

// Keep a list of task rows current: newer views (by lastSeq) replace older ones; new tasks go first.
export function upsertRow(list, task, options) {
  const existing = list.querySelector(`[data-task="${CSS.escape(task.id)}"]`);
  if (existing && Number(existing.dataset.seq) > (task.lastSeq ?? 0)) return;
  // The same view again: a retry form keeps what the owner typed there and the error under it.
  if (existing && Number(existing.dataset.seq) === (task.lastSeq ?? 0) && existing.querySelector("form.retry-form")) return;
  const row = taskRow(task, options);
  if (!existing) {
    list.prepend(row);
    return;
  }
  // A live update must not throw keyboard focus to the page body: focus goes back to the same
  // control in the new row (or its first control).
  const controls = (node) => [...node.querySelectorAll("a[href], button, input, select, textarea, [tabindex]")];
  const focusAt = existing.contains(document.activeElement) ? controls(existing).indexOf(document.activeElement) : null;
  const kept = keepTitle(existing, row) ? existing : row;
  if (kept === row) existing.replaceWith(row);
  if (focusAt !== null && !kept.contains(document.activeElement)) (controls(kept)[focusAt] ?? controls(kept)[0] ?? kept)?.focus();
}

// The row and its title link stay the same elements when the link is unchanged, and the rest is
// the new row's: a click pressed on the link as the task moved on (its state, its step) lands
// when it is released, and a link with focus keeps it. Only the link is kept: the other
// controls carry listeners made for the view they were drawn from. False: nothing was changed.
function keepTitle(existing, row) {
  const head = existing.querySelector(":scope > .task-row-head");
  const freshHead = row.querySelector(":scope > .task-row-head");
  const title = head?.querySelector(":scope > a.task-title");
  const freshTitle = freshHead?.querySelector(":scope > a.task-title");
  if (!title || !freshTitle || title.outerHTML !== freshTitle.outerHTML) return false;
  for (const node of [...head.childNodes]) if (node !== title) node.remove();
  head.append(...[...freshHead.childNodes].filter((node) => node !== freshTitle));
  for (const node of [...existing.childNodes]) if (node !== head) node.remove();
  existing.append(...[...row.childNodes].filter((node) => node !== freshHead));
  existing.dataset.seq = row.dataset.seq;
  return true;
}

function decisionButtons(approval, version, onDone, big) {
  const decide = async (verb, button) => {
    button.disabled = true;
    try {
      const v = current(version);
      await api("POST", `/api/approvals/${approval.id}/${verb}`, v ? { version: v } : {});
      say(verb === "approve" ? `Approved: ${approval.summary}` : `Denied: ${approval.summary}`);
      onDone?.();
    } catch (err) {
      say(err.message);
      button.disabled = false;
    }
  };
  const label = (verb) => `${verb === "approve" ? "Approve" : "Deny"}`;
  const approve = el("button", { type: "button", class: `primary${big ? " big" : ""}`, "aria-describedby": `approval-${approval.id}` }, label("approve"));
  const deny = el("button", { type: "button", class: `danger${big ? " big" : ""}`, "aria-describedby": `approval-${approval.id}` }, label("deny"));
  approve.addEventListener("click", () => decide("approve", approve));
  deny.addEventListener("click", () => decide("deny", deny));
  return el("div", { class: "buttons" }, approve, deny);
}

// What an approval lets happen, shown in full (the detail arrives redacted): the exact command,
// the file with its content or diff, the request, the tool and its arguments, the amount.
const SHOWN_DETAIL = new Set(["action", "command", "path", "bytes", "content", "diff", "method", "url", "body", "tool", "args", "then", "step"]);

function block(label, value, cls = "") {
  return el("div", { class: "approves-block" }, el("h4", {}, label),
    el("pre", { class: `mono ${cls}`.trim(), tabindex: "0", "aria-label": label }, typeof value === "string" ? value : JSON.stringify(value, null, 2)));
}

function approvesWhat(approval) {
  const d = approval.detail ?? {};
  const parts = [];
  if (d.then) parts.push(el("p", { class: "hint" }, `Approving lets step ${d.then} go ahead:`));
  if (d.command) parts.push(block("Command it will run", d.command, "command"));
  if (d.path && d.action === "delete") parts.push(el("p", {}, "Deletes ", el("code", {}, d.path)));
  if (d.path && d.action === "write") {
    parts.push(el("p", {}, "Writes ", el("code", {}, d.path), d.bytes !== undefined ? ` (${d.bytes} bytes)` : ""));
    parts.push(d.diff ? block("Changes to the file", d.diff, "diff") : block("Content", d.content ?? ""));
  }
  if (d.url) parts.push(el("p", {}, `${d.method ?? "GET"} `, el("code", {}, d.url)));
  if (d.body !== undefined) parts.push(block("Request body", d.body));
  if (d.tool) parts.push(el("p", {}, "Tool ", el("code", {}, d.tool)));
  if (d.args !== undefined && Object.keys(d.args ?? {}).length) parts.push(block("Arguments", d.args));
  if (approval.amountCents) parts.push(el("p", { class: "amount" }, `Amount: ${cents(approval.amountCents)}`));
  return parts.length ? el("div", { class: "approves" }, ...parts) : null;
}

// Page images a step stored (before/after screenshots): thumbnails that open large in a dialog.
const SHOT_LABELS = { before: "Before", after: "After", screenshot: "Screenshot" };

export function isImage(artifact) {
  return String(artifact?.type ?? "").startsWith("image/") || /\.(png|jpe?g|gif|webp)$/i.test(String(artifact?.name ?? artifact?.url ?? ""));
}

function shotLabel(name) {
  const match = /-(before|after|screenshot)\.png$/.exec(String(name ?? ""));
  return match ? SHOT_LABELS[match[1]] : String(name ?? "Screenshot");
}

function enlarge(url, label) {
  const dialog = el("dialog", { class: "shot-large", "aria-label": label },
    el("form", { method: "dialog" }, el("button", { type: "submit", class: "close" }, "Close")),
    el("img", { src: url, alt: label }));
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
}

export function shotThumb(url, label) {
  return el("figure", { class: "shot" },
    el("button", { type: "button", class: "thumb", "aria-label": `${label}: enlarge`, onclick: () => enlarge(url, label) },
      el("img", { src: url, alt: label, loading: "lazy" })),
    el("figcaption", {}, label));
}

export function shotThumbs(artifacts) {
  const images = (artifacts ?? []).filter(isImage);
  return images.length ? el("div", { class: "shots" }, images.map((a) => shotThumb(a.url, shotLabel(a.name)))) : null;
}

// A card's version may be a function: read when the owner presses the button, so a card that
// stays up while the task moves on answers the version the task has then.
const current = (version) => (typeof version === "function" ? version() : version);

export function approvalCard(approval, { version, onDone, showTask = false, big = false } = {}) {
  const task = approval.taskView;
  const rest = Object.fromEntries(Object.entries(approval.detail ?? {}).filter(([key]) => !SHOWN_DETAIL.has(key)));
  return el("article", { class: "card blocker approval", "data-approval": String(approval.id), "aria-labelledby": `approval-${approval.id}` },
    el("p", { class: "kicker" }, `Approval · ${approval.kind}`, approval.amountCents ? ` · ${cents(approval.amountCents)}` : ""),
    el("h3", { id: `approval-${approval.id}` }, approval.summary),
    // The task window is the owner's; on the phone (big cards) the card names the task instead.
    showTask && task ? el("p", { class: "task-link" }, "Task: ", big ? el("strong", {}, task.title) : el("a", { href: `/tasks/${task.id}` }, task.title)) : null,
    approval.screenshot ? shotThumb(approval.screenshot, "The page now") : null,
    approvesWhat(approval),
    Object.keys(rest).length ? el("details", {}, el("summary", {}, "Details"), el("pre", { class: "mono" }, JSON.stringify(rest, null, 2))) : null,
    decisionButtons(approval, version ?? task?.version, onDone, big));
}

const INPUT_TYPES = { email: "email", phone: "tel", date: "date", number: "number", text: "text", vault: "password" };

function fieldInput(question, field) {
  const id = `q${question.id}-${field.name}`;
  const describedBy = field.why ? `${id}-why` : null;
  let input;
  if (Array.isArray(field.options) && field.options.length) {
    input = el("select", { id, name: field.name, required: true, "aria-describedby": describedBy },
      field.options.map((option) => el("option", { value: String(option) }, String(option))));
  } else {
    const type = INPUT_TYPES[field.kind] ?? "text";
    input = el("input", {
      id, name: field.name, type, required: !field.optional, "aria-describedby": describedBy,
      autocomplete: type === "email" ? "email" : type === "tel" ? "tel" : "off",
      inputmode: type === "number" ? "decimal" : null, step: type === "number" ? "any" : null,
    });
  }
  return el("div", { class: "field" },
    el("label", { for: id }, field.name.replace(/[_-]+/g, " ")),
    input,
    field.why ? el("p", { class: "hint", id: `${id}-why` }, field.why) : null);
}

export function questionCard(question, { version, onDone, showTask = false, big = false } = {}) {
  const task = question.taskView;
  const fields = question.fields ?? [];
  const errorId = `q${question.id}-error`;
  const form = el("form", { class: "answer", novalidate: true },
    fields.length
      ? fields.map((field) => fieldInput(question, field))
      : question.kind === "human"
        ? el("div", { class: "field" },
            el("label", { for: `q${question.id}-note` }, "Note (optional)"),
            el("input", { id: `q${question.id}-note`, name: "answer", type: "text" }))
        : el("div", { class: "field" },
            el("label", { for: `q${question.id}-answer` }, "Your answer"),
            el("textarea", { id: `q${question.id}-answer`, name: "answer", rows: "2", required: true })),
    el("p", { class: "error", id: errorId, "data-error-for": "", hidden: true }),
    el("div", { class: "buttons" },
      el("button", { type: "submit", class: `primary${big ? " big" : ""}` }, question.kind === "human" ? "Done, go on" : "Answer")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = form.querySelector(`#${errorId}`);
    error.hidden = true;
    if (!form.reportValidity()) return;
    const data = new FormData(form);
    // What became of an action is one choice, sent as the answer (the box refuses it as inputs).
    const body = question.kind === "action" && fields.length
      ? { answer: String(data.get(fields[0].name) ?? "") }
      : fields.length
        ? { inputs: Object.fromEntries(fields.map((f) => [f.name, String(data.get(f.name) ?? "")])) }
        : { answer: String(data.get("answer") ?? "") };
    const v = current(version) ?? task?.version;
    if (v) body.version = v;
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      await api("POST", `/api/questions/${question.id}/answer`, body);
      say("Answer sent");
      onDone?.();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
      button.disabled = false;
    }
  });
  return el("article", { class: "card blocker question", "data-question": String(question.id), "aria-labelledby": `question-${question.id}` },
    el("p", { class: "kicker" }, `Question · ${question.kind}`),
    el("h3", { id: `question-${question.id}` }, question.prompt || "The task needs an answer"),
    showTask && task ? el("p", { class: "task-link" }, "Task: ", el("a", { href: `/tasks/${task.id}` }, task.title)) : null,
    question.screenshot ? shotThumb(question.screenshot, "The page now") : null,
    // In the inbox and on the phone a wall's card carries the kept browser, live (the task
    // window shows it beside its blockers).
    question.kind === "human" && showTask && task ? new BrowserView(task.id, { big }).start().node : null,
    form);
}

// Ask in the page's confirm dialog; resolves true when the owner chose `yes` (Escape is no).
export function confirmThen(title, text, yes) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = yes;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.showModal();
  });
}
