// A workspace's page: browse its files (through GET /api/workspaces/<name>/files), download one,
// and upload a file (PUT /api/workspaces/<name>/files/<path>), which lands as a done task of its own.
import { ApiError, api, clearErrors, el, initialData, put, showError } from "./api.js";

const { workspace } = initialData();
const list = document.getElementById("files");
const empty = document.getElementById("files-empty");
const where = document.getElementById("files-where");
const form = document.getElementById("upload-form");
const history = document.getElementById("history");
let folder = "";

const fileUrl = (path) =>
  `/api/workspaces/${encodeURIComponent(workspace)}/files/${path.split("/").map(encodeURIComponent).join("/")}`;

async function browse(path) {
  const query = new URLSearchParams({ path });
  const found = await api("GET", `/api/workspaces/${encodeURIComponent(workspace)}/files?${query}`);
  folder = found.path;
  const rows = [];
  if (folder) {
    const up = folder.includes("/") ? folder.slice(0, folder.lastIndexOf("/")) : "";
    rows.push(el("li", {}, el("button", { type: "button", class: "link", onclick: () => show(up) }, "↑ up")));
  }
  for (const entry of found.entries ?? []) {
    if (entry.type === "dir") {
      rows.push(el("li", {}, el("button", { type: "button", class: "link", onclick: () => show(entry.path) }, `${entry.name}/`)));
    } else if (entry.type === "file") {
      rows.push(el("li", {}, el("a", { href: fileUrl(entry.path), download: entry.name }, entry.name),
                   " ", el("span", { class: "hint" }, `${entry.size} bytes`)));
    } else {
      rows.push(el("li", {}, entry.name, " ", el("span", { class: "hint" }, entry.type)));
    }
  }
  put(list, rows);
  empty.hidden = (found.entries ?? []).length > 0;
  where.textContent = folder ? `In ${folder}/` : "At the top of the workspace";
}

function show(path) {
  browse(path).catch((err) => { where.textContent = err.message; });
}

async function upload(file, path) {
  const init = {
    method: "PUT", credentials: "same-origin", body: file,
    headers: { Accept: "application/json", "Content-Type": "application/octet-stream",
               "X-CSRFToken": document.querySelector('meta[name="csrf-token"]')?.content ?? "" },
  };
  let response;
  try {
    response = await fetch(fileUrl(path), init);
  } catch {
    throw new ApiError(0, { code: "OFFLINE", message: "the box cannot be reached; check the connection" });
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(form);
  const file = form.elements.file.files[0];
  if (!file) {
    showError(form, { field: "", message: "Choose a file first" });
    return;
  }
  const named = form.elements.path.value.trim();
  const path = named || (folder ? `${folder}/${file.name}` : file.name);
  try {
    const done = await upload(file, path);
    document.getElementById("upload-done").textContent = `Uploaded ${done.path} (${done.size} bytes).`;
    document.getElementById("history-empty")?.remove();
    history.prepend(el("li", {}, el("a", { href: `/tasks/${done.task.id}` }, done.task.title), " ",
                       el("span", { class: "state", "data-state": done.task.state }, done.task.state), " ",
                       el("span", { class: "hint" }, "upload")));
    form.reset();
    await browse(folder);
  } catch (err) {
    showError(form, err);
  }
});

show("");
