// Settings: defaults, vault names, remembered page elements, API tokens, paired phones and pairing.
import { api, clearErrors, el, say, showError, when, put } from "./api.js";
import { confirmThen } from "./render.js";

const $ = (id) => document.getElementById(id);

// Every Revoke/Delete here asks first, in the page's confirm dialog, as the task window does.
function rowWith(label, detail, buttonLabel, onClick) {
  const button = el("button", { type: "button", class: "danger small" }, buttonLabel);
  button.addEventListener("click", async () => {
    if (!(await confirmThen(`${buttonLabel}?`, "This cannot be undone.", buttonLabel))) return;
    button.disabled = true;
    try { await onClick(); } catch (err) { say(err.message); button.disabled = false; }
  });
  return el("li", {}, el("div", {}, el("strong", {}, label), el("p", { class: "hint" }, detail)), button);
}

// --- defaults -------------------------------------------------------------------------------
const defaults = $("defaults");
defaults.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(defaults);
  const f = defaults.elements;
  const whole = (input) => (input.value === "" ? NaN : Number(input.value));
  const body = {
    defaultBudgetCents: whole(f.defaultBudgetCents),
    networkDefault: f.networkDefault.value,
    defaultHosts: f.defaultHosts.value.split(/[\s,]+/).filter(Boolean),
    retentionDays: whole(f.retentionDays),
    retentionCount: whole(f.retentionCount),
    maxActiveTasks: whole(f.maxActiveTasks),
    taskMemoryMb: whole(f.taskMemoryMb),
    taskCpuPercent: whole(f.taskCpuPercent),
    taskDiskMb: whole(f.taskDiskMb),
    tasksMayCreateWork: f.tasksMayCreateWork.checked,
    maxCreatedPerTask: whole(f.maxCreatedPerTask),
  };
  for (const [key, value] of Object.entries(body)) {
    if (typeof value === "number" && !Number.isInteger(value)) {
      showError(defaults, { field: key, message: "a whole number, please" });
      return;
    }
  }
  try {
    await api("PATCH", "/api/settings", body);
    say("Defaults saved");
  } catch (err) {
    showError(defaults, err);
  }
});

// --- notifications ------------------------------------------------------------------------
const notifyForm = $("notify-form");
notifyForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(notifyForm);
  const urls = notifyForm.elements.notifyUrls.value.split("\n").map((line) => line.trim()).filter(Boolean);
  try {
    const saved = await api("PATCH", "/api/settings", { notifyUrls: urls });
    notifyForm.elements.notifyUrls.value = saved.notifyUrls.join("\n");
    say("Notifications saved");
  } catch (err) {
    showError(notifyForm, err);
  }
});

// --- the model ------------------------------------------------------------------------------
const modelForm = $("model-form");
modelForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(modelForm);
  const f = modelForm.elements;
  const price = (input) => (input.value === "" ? null : Number(input.value));
  const body = {
    baseUrl: f.baseUrl.value.trim(),
    model: f.model.value.trim(),
    keyName: f.keyName.value.trim(),
    inputCentsPerMillion: price(f.inputCentsPerMillion),
    outputCentsPerMillion: price(f.outputCentsPerMillion),
  };
  if (f.key.value) body.key = f.key.value;
  try {
    const saved = await api("PATCH", "/api/settings/model", body);
    f.key.value = "";
    $("model-state").textContent = saved.configured ? `Configured: ${saved.model}.` : "No model is configured.";
    say("Model saved");
    loadVault();
  } catch (err) {
    showError(modelForm, err);
  }
});
$("model-test").addEventListener("click", async () => {
  const out = $("model-test-result");
  out.hidden = false;
  out.textContent = "Asking the model…";
  try {
    const result = await api("POST", "/api/settings/model/test");
    out.textContent = result.ok ? `It answered: “${result.answer}” in ${result.latencyMs} ms.`
      : result.kind === 'capability' ? `It answered, but it cannot do all a task needs: ${result.error}`
      : `It failed: ${result.error}`;
  } catch (err) {
    out.textContent = err.message;
  }
});

// --- vault ----------------------------------------------------------------------------------
async function loadVault() {
  const list = $("vault-list");
  try {
    const vault = await api("GET", "/api/vault");
    const rows = (vault.results ?? vault.secrets ?? []).map((secret) =>
      rowWith(secret.name, `set ${when(secret.updatedAt ?? secret.createdAt)}`, `Delete ${secret.name}`, async () => {
        await api("DELETE", `/api/vault/${encodeURIComponent(secret.name)}`);
        say(`Deleted ${secret.name}`);
        loadVault();
      }));
    put(list, ...(rows.length ? rows : [el("li", { class: "empty" }, "The vault is empty.")]));
  } catch (err) {
    put(list, el("li", { class: "error" }, err.message));
  }
}
const vaultForm = $("vault-form");
vaultForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(vaultForm);
  const name = vaultForm.elements.name.value.trim();
  const value = vaultForm.elements.value.value;
  try {
    await api("POST", "/api/vault", { name, value });
    vaultForm.reset();
    say(`Saved ${name}`);
    loadVault();
  } catch (err) {
    showError(vaultForm, err);
  }
});

// --- remembered page elements (the grounding cache) -------------------------------------------
async function loadCache() {
  const list = $("cache-list");
  try {
    const cache = await api("GET", "/api/browser/cache?limit=200");
    const rows = cache.results.map((entry) =>
      rowWith(`“${entry.instruction}”`, `${entry.origin}${entry.path} · ${entry.workspace} · ${entry.fingerprint.role || entry.fingerprint.tag || "element"} “${entry.fingerprint.name || entry.fingerprint.text || ""}” · found ${when(entry.groundedAt)} · replayed ${entry.uses}×`,
        `Forget “${entry.instruction}”`, async () => {
          await api("DELETE", `/api/browser/cache/${entry.id}`);
          say("Forgotten");
          loadCache();
        }));
    put(list, ...(rows.length ? rows : [el("li", { class: "empty" }, "Nothing is remembered.")]));
    $("cache-clear").hidden = !rows.length;
  } catch (err) {
    put(list, el("li", { class: "error" }, err.message));
  }
}
$("cache-clear").addEventListener("click", async () => {
  const label = "Clear remembered elements";
  if (!(await confirmThen(`${label}?`, "Each instruction asks the model again on its next run.", label))) return;
  try {
    const done = await api("DELETE", "/api/browser/cache");
    say(`Cleared ${done.cleared}`);
    loadCache();
  } catch (err) {
    say(err.message);
  }
});

// --- API tokens -----------------------------------------------------------------------------
async function loadTokens() {
  const tokens = await api("GET", "/api/tokens");
  put($("token-list"), ...tokens.results.map((t) => t.revokedAt
    ? el("li", { class: "revoked" }, el("div", {}, el("strong", {}, t.name), el("p", { class: "hint" }, `${t.prefix}… revoked ${when(t.revokedAt)}`)))
    : rowWith(t.name, `${t.prefix}…${t.canUseFolders ? " · may use folders" : ""} · last used ${t.lastUsedAt ? when(t.lastUsedAt) : "never"}`,
        `Revoke ${t.name}`, async () => { await api("POST", `/api/tokens/${t.id}/revoke`); say(`Revoked ${t.name}`); forgetShownToken(t.id); loadTokens(); })));
}

// The value shown once after creating a token goes away when that token is revoked.
let shownTokenId = null;
function forgetShownToken(id) {
  if (id !== shownTokenId) return;
  shownTokenId = null;
  $("new-token").hidden = true;
  $("new-token-value").value = "";
}
const tokenForm = $("token-form");
tokenForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(tokenForm);
  try {
    const created = await api("POST", "/api/tokens", { name: tokenForm.elements.name.value, canUseFolders: tokenForm.elements.canUseFolders.checked });
    tokenForm.reset();
    $("new-token").hidden = false;
    const out = $("new-token-value");
    out.value = created.token;
    shownTokenId = created.id;
    out.focus();
    out.select();
    loadTokens();
  } catch (err) {
    showError(tokenForm, err);
  }
});

// --- phones ---------------------------------------------------------------------------------
async function loadDevices() {
  const devices = await api("GET", "/api/devices");
  put($("device-list"), ...devices.results.map((d) => d.revokedAt
    ? el("li", { class: "revoked" }, el("div", {}, el("strong", {}, d.name), el("p", { class: "hint" }, `revoked ${when(d.revokedAt)}`)))
    : rowWith(d.name, `paired ${when(d.createdAt)} · last seen ${d.lastSeenAt ? when(d.lastSeenAt) : "never"}`,
        `Revoke ${d.name}`, async () => { await api("POST", `/api/devices/${d.id}/revoke`); say(`Revoked ${d.name}`); loadDevices(); })));
}
$("pair-start").addEventListener("click", async () => {
  try {
    const pairing = await api("POST", "/api/pairing");
    // The SVG is drawn by the box itself (boxsite.core.qr), not from user input.
    $("pairing-reach").hidden = !pairing.reachWarning;
    $("pairing-reach").textContent = pairing.reachWarning ?? "";
    $("pairing-qr").innerHTML = pairing.qrSvg;
    $("pairing-url").textContent = new URL("/pair", pairing.url).href;
    $("pairing-code").textContent = pairing.code;
    $("pairing-expiry").textContent = `Works once, until ${when(pairing.expiresAt)}.`;
    $("pairing").hidden = false;
    $("pair-start").textContent = "Show a new code";
    pollDevices(pairing.expiresAt);
  } catch (err) {
    say(err.message);
  }
});

// While a code is on screen, notice the phone pairing and list it.
let devicePoll = null;
function pollDevices(until) {
  clearInterval(devicePoll);
  const before = $("device-list").children.length;
  devicePoll = setInterval(async () => {
    if (Date.now() > Date.parse(until)) { clearInterval(devicePoll); return; }
    await loadDevices();
    if ($("device-list").children.length > before) {
      clearInterval(devicePoll);
      $("pairing").hidden = true;
      say("A phone was paired");
    }
  }, 2000);
}

loadVault();
loadCache();
loadTokens().catch((err) => say(err.message));
loadDevices().catch((err) => say(err.message));
