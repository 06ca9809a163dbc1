// The task window: header, blockers, live action log, Diff and Report tabs, and every button
// the task's `next` list offers (the page never guesses the state machine).
import { api, cents, el, refreshInboxCount, say, time, put } from "./api.js";
import { BrowserView } from "./browser-view.js";
import { statusBadge, TaskStream } from "./live.js";
import { approvalCard, confirmThen, costText, isImage, questionCard, retryForm, shotThumbs, stateText } from "./render.js";

const root = document.getElementById("task-window");
const taskId = root.dataset.task;
const $ = (id) => document.getElementById(id);
let task = null;
let stream = null;
const loaded = { diff: false, report: false };

const KIND_LABELS = {
  status: "Status", step: "Step", step_result: "Result", tool_call: "Tool call", tool_result: "Tool result", cost: "Cost",
  blocked_connection: "Blocked", approval: "Approval", question: "Question", output: "Output",
  error: "Error", note: "Note",
};

// --- header ----------------------------------------------------------------------------------
function renderHeader(t) {
  task = t;
  $("task-title").textContent = t.title;
  const badge = $("task-state");
  badge.textContent = stateText(t);
  badge.className = `badge state-${t.state}${t.review ? ` review-${t.review}` : ""}`;
  badge.dataset.state = t.state;
  const pause = $("task-pause");
  pause.hidden = t.state !== "waiting";
  pause.textContent = t.state === "waiting" ? (t.pause?.message || stateText(t)) : "";
  $("task-step").textContent = t.step || "—";
  $("task-cost").textContent = costText(t);
  const pct = Math.round((t.progress ?? 0) * 100);
  $("task-progress").value = pct;
  $("task-progress-text").textContent = `${pct}%`;
  $("task-worker").textContent = t.worker;
  if (t.folders?.length) $("task-target").textContent = t.folders.join(", ");
  else put($("task-target"), "workspace ", el("a", { href: `/workspaces/${encodeURIComponent(t.workspace)}` }, t.workspace));
  const madeBy = t.createdBy
    ? [" · created by ", el("a", { href: `/tasks/${encodeURIComponent(t.createdBy.task)}` }, `task ${t.createdBy.task}`),
       t.createdBy.run ? `, run ${t.createdBy.run}` : null]
    : [];
  put($("task-source"), t.source, ...madeBy);
  const answer = $("task-answer");
  const shown = t.result ?? t.answer;
  answer.hidden = shown === null || shown === undefined;
  put(answer, ...(answer.hidden ? [] : [el("strong", {}, t.result != null ? "Result: " : "Answer: "),
    typeof shown === "string" ? shown : el("pre", { class: "mono" }, JSON.stringify(shown, null, 2))]));
  const error = $("task-error");
  error.hidden = !t.error;
  put(error, ...(t.error ? [el("strong", {}, "Error: "), t.error, t.hint ? el("p", { class: "hint" }, t.hint) : null] : []));
  renderReview(t);
  renderActions(t);
  renderBrowser(t);
}

// --- the kept browser, live (any pause of a task with a browser keeps it) -----------------------
let browserView = null;
let browserVersion = null;

function renderBrowser(t) {
  if (t.state !== "waiting") {
    browserView?.stop();
    browserVersion = null;
    return;
  }
  if (browserVersion === t.version) return; // asked once per pause; the box says 4404 when nothing is kept
  browserVersion = t.version;
  if (!browserView) {
    browserView = new BrowserView(taskId);
    put($("browser-live"), browserView.node);
  }
  browserView.start();
}

// Keep answers with the conflicting paths, and the log keeps them (the event that recorded the
// conflict), so a reloaded window still says which paths conflicted.
let loggedConflicts = [];

function conflictPaths(t, extra) {
  if (t.review !== "conflict") return [];
  return extra ?? t.conflicts ?? loggedConflicts;
}

function renderReview(t, conflicts) {
  const box = $("task-review");
  box.hidden = !t.review;
  if (!t.review) return;
  const words = {
    pending: "Waiting for your review. Nothing in your folders changes until you press Keep.",
    kept: "Kept: the changes were applied to your folders.",
    conflict: "Conflict: you changed some of the same files since the task started, so nothing was applied.",
    undone: "Undone: the changes were discarded.",
  };
  const paths = conflictPaths(t, conflicts);
  box.className = `review review-${t.review}`;
  put(box,
    el("h2", {}, "Review"),
    el("p", {}, words[t.review] ?? t.review),
    paths.length ? el("div", {}, el("p", {}, "These paths conflicted:"),
      el("ul", { class: "paths", "aria-label": "Conflicting paths" }, paths.map((p) => el("li", { class: "mono" }, p)))) : null);
}

const ACTIONS = {
  keep: { label: "Keep", cls: "primary", run: keep },
  continue: { label: "Continue", cls: "primary", run: () => act("continue", {}) },
  cancel: { label: "Cancel", cls: "danger", run: () => confirmed("Cancel this task?", "It stops now; what it changed stays in its own layer.", "Cancel the task", () => act("cancel")) },
  // A new task from this one's spec, in the New task form so it can be edited first.
  rerun: { label: "Run again", cls: "", run: () => window.location.assign(`/tasks?again=${encodeURIComponent(taskId)}#new-task-title`) },
  undo: { label: "Undo", cls: "danger", run: () => confirmed("Undo this task?", "Its changes are removed for good. Every other task keeps its changes.", "Undo the task", () => act("undo")) },
};

function openBlockers() {
  return (task?.approvals ?? []).some((a) => a.state === "pending") || (task?.questions ?? []).some((q) => q.state === "open");
}

let actionsShown = "";

function renderActions(t) {
  // Drawn again only when what they offer changed: a live frame about the same version must not
  // wipe what the owner is typing (a retry's raised limit) or an error shown under it.
  const key = JSON.stringify([t.version, t.next, t.review, openBlockers()]);
  if (key === actionsShown) return;
  actionsShown = key;
  const box = $("task-actions");
  const buttons = [];
  for (const verb of t.next ?? []) {
    if (verb === "retry") {
      buttons.push(retryForm(t, { onDone: (updated) => refresh(updated) }));
      continue;
    }
    const action = ACTIONS[verb];
    if (!action) continue; // approve/deny/answer live on their cards; diff/report are tabs
    if (verb === "continue" && openBlockers()) continue; // answered through the question's form
    const label = verb === "keep" && t.review === "conflict" ? "Try Keep again" : action.label;
    const button = el("button", { type: "button", class: action.cls, "data-verb": verb }, label);
    button.addEventListener("click", async () => {
      button.disabled = true;
      try { await action.run(); } finally { button.disabled = false; }
    });
    buttons.push(button);
  }
  put(box, ...buttons);
}

async function confirmed(title, text, yes, then) {
  if (await confirmThen(title, text, yes)) await then();
}

async function act(verb, body) {
  try {
    const updated = await api("POST", `/api/tasks/${taskId}/${verb}`, body);
    await refresh(updated);
    say(`${verb[0].toUpperCase()}${verb.slice(1)}: done`);
  } catch (err) {
    say(err.message);
  }
}

async function keep() {
  try {
    const updated = await api("POST", `/api/tasks/${taskId}/keep`, {});
    if (updated.conflicts?.length) loggedConflicts = updated.conflicts;
    await refresh(updated);
    say(task.review === "conflict" ? "Nothing was applied: some paths conflicted" : "Kept");
  } catch (err) {
    say(err.message);
    await refresh();
  }
}

// --- blockers (approvals and questions) -------------------------------------------------------
let blockersShown = "";

function renderBlockers() {
  const box = $("blockers");
  const approvals = (task.approvals ?? []).filter((a) => a.state === "pending");
  const questions = (task.questions ?? []).filter((q) => q.state === "open");
  // Drawn again only when the open cards changed: a new version of the same wait (the run parks
  // the task after it asked) must not wipe what the owner is typing into a question's fields.
  const key = JSON.stringify([approvals.map((a) => a.id), questions.map((q) => q.id)]);
  if (key === blockersShown) return;
  blockersShown = key;
  const cards = [
    ...approvals.map((a) => approvalCard(a, { version: () => task.version, onDone: () => refresh() })),
    ...questions.map((q) => questionCard(q, { version: () => task.version, onDone: () => refresh() })),
  ];
  put(box, ...(cards.length ? [el("h2", {}, "Waiting for you"), ...cards] : []));
}

async function refresh(taskView) {
  // The detail view carries approvals and questions; ask only for log lines we do not have.
  const after = stream ? stream.last : 0;
  const full = await api("GET", `/api/tasks/${taskId}?after=${after}`);
  // A reply can arrive after the live stream already showed a newer state: keep the newest.
  const newest = [task, taskView].filter(Boolean).reduce((a, b) => (b.version > a.version ? b : a), full);
  renderHeader({ ...full, ...(newest.version > full.version ? newest : {}) });
  renderBlockers();
  refreshInboxCount();
  if (loaded.diff) loadDiff();
  if (loaded.report) loadReport();
}

let refreshTimer = null;
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => refresh().catch((err) => say(err.message)), 150);
}

// --- the actions table (the same cells the page's first paint drew) -----------------------------
function receiptCell(a) {
  const r = a.receipt;
  const outcome = r?.status ? `HTTP ${r.status}, ${r.bytes} bytes` : r?.reconciled ? "confirmed by the owner" : r ? (r.ok ? "ok" : "failed") : null;
  return el("td", { "data-label": "Receipt" },
    outcome,
    r?.digest ? [" ", el("small", {}, el("code", { title: r.digest }, r.digest.length > 19 ? `${r.digest.slice(0, 18)}…` : r.digest))] : null,
    r?.excerpt ? [" ", el("small", { class: "excerpt" }, r.excerpt.length > 120 ? `${r.excerpt.slice(0, 119)}…` : r.excerpt)] : null,
    a.error ? [" ", el("small", { class: "error" }, a.error)] : null,
    !r && !a.error ? "—" : null);
}

function actionRow(a) {
  return el("tr", { "data-action": String(a.id) },
    el("td", {}, el("code", {}, a.target), " ", el("small", {}, a.position)),
    el("td", {}, el("span", { class: `badge action-${a.state}` }, a.state),
      a.reconciliation ? [" ", el("small", {}, `the owner said: ${a.reconciliation.answer}`)] : null),
    receiptCell(a),
    el("td", { "data-label": "Attempted" }, a.attemptedAt ? el("time", { datetime: a.attemptedAt }, time(a.attemptedAt)) : "not yet"));
}

let actionsTimer = null;
let actionsShownKey = null;

async function loadActions() {
  const page = await api("GET", `/api/tasks/${taskId}/actions?limit=50`);
  // Redrawn only when something in it changed, so a live frame leaves the table (and any
  // selection in it) alone.
  const key = JSON.stringify(page.results);
  if (key === actionsShownKey) return;
  actionsShownKey = key;
  put($("action-rows"), ...page.results.map(actionRow));
  $("action-records").hidden = page.results.length === 0;
}

// Actions move with the log (proposed, executing, settled, reconciled): one read per burst of events.
function actionsSoon() {
  clearTimeout(actionsTimer);
  actionsTimer = setTimeout(() => loadActions().catch((err) => say(err.message)), 200);
}

// --- the action log ---------------------------------------------------------------------------
function artifactNode(artifact) {
  const item = typeof artifact === "string" ? { url: artifact } : artifact ?? {};
  const src = item.url ?? item.src ?? item.href ?? null;
  const name = item.name ?? item.label ?? item.kind ?? "attachment";
  const image = src && (item.kind === "screenshot" || String(item.mime ?? "").startsWith("image/") || /^data:image\//.test(src) || /\.(png|jpe?g|gif|webp)$/i.test(src));
  if (image) return el("figure", { class: "shot" }, el("a", { href: src, target: "_blank", rel: "noopener" }, el("img", { src, alt: item.alt ?? `Screenshot: ${name}`, loading: "lazy" })), el("figcaption", {}, name));
  return src ? el("a", { href: src, rel: "noopener" }, name) : el("span", {}, name);
}

// What a step did (a step_result event): its numbers in a line, its output in monospace blocks.
const RESULT_FACTS = [["exitCode", "Exit code"], ["status", "HTTP status"], ["method", "Method"], ["url", "URL"],
  ["title", "Page title"], ["rows", "Rows"], ["path", "Path"], ["bytes", "Bytes"], ["linesReported", "Lines reported"], ["durationMs", "Took (ms)"]];
const RESULT_BLOCKS = [["command", "Command"], ["stdout", "Output (stdout, last lines)"], ["stderr", "Errors (stderr, last lines)"],
  ["body", "Body"], ["tool", "Tool"], ["args", "Arguments"], ["result", "Result"], ["element", "Element chosen"], ["records", "Records"],
  ["error", "Error"]];

function outputBlock(label, value) {
  return el("div", { class: "result-block" }, el("h4", {}, label),
    el("pre", { class: "mono output", tabindex: "0", "aria-label": label }, typeof value === "string" ? value : JSON.stringify(value, null, 2)));
}

// A step answered from an earlier call's receipt (a resumed run found the call done): say so in
// plain words and show what the receipt holds, never the excerpt dressed up as the whole body.
function receiptPart(data) {
  const receipt = data.receipt ?? {};
  const verb = data.kind === "tool" ? "called" : "sent";
  const action = data.action ? ` (action ${data.action})` : "";
  if (receipt.reconciled !== undefined) {
    return el("p", { class: "hint replayed" }, `Not ${verb} again: the owner said the earlier attempt${action} happened, so there is no response to show.`);
  }
  const facts = [["bytes", "Size of the response (bytes)"], ["digest", "Digest of the response"]]
    .filter(([key]) => receipt[key] !== undefined && receipt[key] !== null);
  return el("div", { class: "receipt" },
    el("p", { class: "hint replayed" }, `Not ${verb} again: answered from the earlier call's receipt${action}. `
      + "A receipt keeps the status, the size and a digest of the response and only its first characters; that is what is shown here."),
    facts.length ? el("dl", { class: "result-facts" }, facts.map(([key, label]) => el("div", {}, el("dt", {}, label), el("dd", { class: "mono" }, String(receipt[key]))))) : null,
    receipt.excerpt !== undefined && receipt.excerpt !== "" ? outputBlock("Start of the response (kept in the receipt)", receipt.excerpt) : null,
    receipt.result !== undefined ? outputBlock("Result (kept in the receipt)", receipt.result) : null);
}

function resultBody(data, artifacts) {
  const facts = RESULT_FACTS.filter(([key]) => data[key] !== undefined && data[key] !== null);
  // A replayed step's result is the receipt's: it is shown once, in the receipt's part.
  const blocks = RESULT_BLOCKS.filter(([key]) => data[key] !== undefined && data[key] !== null && data[key] !== ""
    && !(data.replayed && ["body", "result"].includes(key)));
  return el("div", { class: "step-result" },
    data.replayed ? receiptPart(data) : null,
    facts.length ? el("dl", { class: "result-facts" }, facts.map(([key, label]) => el("div", {}, el("dt", {}, label), el("dd", { class: "mono" }, String(data[key]))))) : null,
    blocks.map(([key, label]) => outputBlock(label, data[key])),
    (artifacts ?? []).filter((a) => !isImage(a)).length ? el("p", { class: "artifacts" }, "Files: ",
      artifacts.filter((a) => !isImage(a)).map((a) => el("a", { href: a.url, target: "_blank", rel: "noopener" }, `${a.name} (${a.size} bytes)`))) : null);
}

function resultDetails(event) {
  const data = event.data ?? {};
  const label = ["run", "command"].includes(data.kind) ? "Output" : "Result";
  const again = data.receipt?.reconciled !== undefined ? "(not sent again)" : "(from the earlier call's receipt)";
  const shown = data.ok === false ? `${label} (failed)` : data.replayed ? `${label} ${again}` : label;
  return el("details", { class: "result" }, el("summary", {}, shown), resultBody(data, event.artifacts));
}

// A step run again (after a restart, a lost worker or a retry) says so in its label, and the
// note that the box restarted is labelled as what it is, not as a bare note.
function kindLabel(event, data) {
  if (event.kind === "step" && data.retry) return "Retry";
  if (event.kind === "note" && data.restart) return "Restart";
  return KIND_LABELS[event.kind] ?? event.kind;
}

function appendEvent(event) {
  const log = $("log");
  const data = event.data ?? {};
  if (Array.isArray(data.conflicts)) loggedConflicts = data.conflicts;
  const marked = (event.kind === "step" && data.retry) || (event.kind === "note" && data.restart);
  const row = el("li", { class: `event kind-${event.kind}${marked ? " again" : ""}`, "data-seq": String(event.seq) },
    el("div", { class: "event-line" },
      el("time", { datetime: event.createdAt }, time(event.createdAt)),
      el("span", { class: `kind kind-${event.kind}` }, kindLabel(event, data)),
      el("span", { class: "summary" }, event.summary),
      event.costCents ? el("span", { class: "cost" }, cents(event.costCents)) : null),
    // A status line says it all in its summary; other kinds carry details worth opening.
    event.kind === "step_result" ? shotThumbs(event.artifacts) : null,
    event.kind === "step_result" ? resultDetails(event)
      : event.kind !== "status" && Object.keys(data).length ? el("details", {}, el("summary", {}, "Details"), el("pre", { class: "mono" }, JSON.stringify(data, null, 2))) : null,
    event.kind !== "step_result" && (event.artifacts ?? []).length ? el("div", { class: "artifacts" }, event.artifacts.map(artifactNode)) : null);
  const nearBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  log.append(row);
  if (nearBottom && log.children.length > 1 && !$("panel-log").hidden) row.scrollIntoView({ block: "nearest" });
}

// --- tabs: Log, Diff, Report ------------------------------------------------------------------
const tabs = [...document.querySelectorAll('[role="tab"]')];
function select(tab) {
  for (const t of tabs) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  if (tab.id === "tab-diff") loadDiff();
  if (tab.id === "tab-report") loadReport();
}
for (const tab of tabs) {
  tab.addEventListener("click", () => select(tab));
  tab.addEventListener("keydown", (event) => {
    const i = tabs.indexOf(tab);
    const next = { ArrowRight: tabs[(i + 1) % tabs.length], ArrowLeft: tabs[(i - 1 + tabs.length) % tabs.length], Home: tabs[0], End: tabs[tabs.length - 1] }[event.key];
    if (next) { event.preventDefault(); next.focus(); select(next); }
  });
}

function pathList(title, paths, cls) {
  return el("section", { class: `paths-group ${cls}` },
    el("h3", {}, `${title} (${paths.length})`),
    paths.length ? el("ul", { class: "paths" }, paths.map((p) => el("li", { class: "mono" }, p))) : el("p", { class: "empty" }, "none"));
}

function diffLines(text) {
  return el("pre", { class: "diff mono", tabindex: "0", "aria-label": "Unified diff" }, text.split("\n").map((line) => {
    let cls = "";
    if (line.startsWith("+++") || line.startsWith("---")) cls = "file";
    else if (line.startsWith("+")) cls = "add";
    else if (line.startsWith("-")) cls = "del";
    else if (line.startsWith("@@")) cls = "hunk";
    return el("span", { class: cls }, `${line}\n`);
  }));
}

async function loadDiff() {
  loaded.diff = true;
  const box = $("diff");
  try {
    const diff = await api("GET", `/api/tasks/${taskId}/diff`);
    put(box,
      el("div", { class: "diff-summary" },
        pathList("Added", diff.added ?? [], "added"),
        pathList("Modified", diff.modified ?? [], "modified"),
        pathList("Deleted", diff.deleted ?? [], "deleted")),
      (diff.binary ?? []).length ? el("p", { class: "hint" }, `Binary files (not shown): ${diff.binary.join(", ")}`) : null,
      (diff.special ?? []).length ? el("p", { class: "hint" },
        `Special files (listed, never opened or kept): ${diff.special.map((item) => `${item.path} (${item.type})`).join(", ")}`) : null,
      diff.diff ? diffLines(diff.diff) : el("p", { class: "empty" }, "No changes."),
      diff.truncated ? el("p", { class: "hint" }, "The diff was cut short; it is too long to show whole.") : null);
  } catch (err) {
    put(box, el("p", { class: "error" }, err.message));
  }
}

async function loadReport() {
  loaded.report = true;
  const box = $("report");
  try {
    const report = await api("GET", `/api/tasks/${taskId}/report`);
    const records = report.records ?? report.task?.records;
    const output = report.result ?? null;
    const steps = report.steps ?? [];
    put(box,
      steps.length ? el("section", {}, el("h3", {}, "Steps"), el("ol", { class: "report-steps" }, steps.map((step) => el("li", { value: String(step.step) },
        el("p", {}, el("strong", {}, `Step ${step.step}`), step.kind ? ` ${step.kind}` : "", step.outcome ? ` · ${step.outcome}` : "", step.summary ? el("span", { class: "muted" }, ` · ${step.summary}`) : null),
        step.result ? shotThumbs(step.result.artifacts) : null,
        step.result ? el("details", { class: "result" }, el("summary", {}, step.result.ok === false ? "What it did (failed)" : "What it did"), resultBody(step.result, step.result.artifacts)) : null)))) : null,
      output !== null && output !== undefined ? el("section", {}, el("h3", {}, "Result (shaped by the model)"), el("pre", { class: "mono" }, typeof output === "string" ? output : JSON.stringify(output, null, 2))) : null,
      records && Object.keys(records).length ? el("section", {}, el("h3", {}, "Records"), el("pre", { class: "mono" }, JSON.stringify(records, null, 2))) : null,
      el("details", {}, el("summary", {}, "The whole report"), el("pre", { class: "mono" }, JSON.stringify(report, null, 2))));
  } catch (err) {
    put(box, el("p", { class: "error" }, err.message));
  }
}

// --- start ------------------------------------------------------------------------------------
async function start() {
  const view = await api("GET", `/api/tasks/${taskId}`);
  for (const event of view.log.events) appendEvent(event);
  renderHeader(view);
  renderBlockers();
  // The first paint's table has the server's raw times: drawn once more the way live updates draw it.
  if (!$("action-records").hidden) actionsSoon();
  stream = new TaskStream(taskId, {
    after: view.log.nextAfter,
    onEvent: (event) => {
      appendEvent(event);
      if (["status", "approval", "question"].includes(event.kind)) refreshSoon();
      if (event.kind !== "cost") actionsSoon();
    },
    onTask: (t) => { if (!task || t.version >= task.version) renderHeader({ ...task, ...t }); },
    onStatus: statusBadge($("stream-status")),
  }).start();
}

start().catch((err) => say(err.message));
