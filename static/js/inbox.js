// The inbox: every open approval and question across tasks, answerable in place.
import { api, el, initialData, refreshInboxCount, say, put } from "./api.js";
import { ListStream, statusBadge } from "./live.js";
import { approvalCard, questionCard } from "./render.js";

const box = document.getElementById("inbox");
const empty = document.getElementById("inbox-empty");

export async function loadInbox(target, { big = false } = {}) {
  const inbox = await api("GET", "/api/inbox");
  const reload = () => loadInbox(target, { big }).catch((err) => say(err.message));
  const cards = [
    ...inbox.approvals.map((a) => approvalCard(a, { showTask: true, onDone: reload, big })),
    ...inbox.questions.map((q) => questionCard(q, { showTask: true, onDone: reload, big })),
  ];
  // Keep a form someone is typing into: only replace the cards when what is open changed.
  const key = cards.map((c) => c.dataset.approval ? `a${c.dataset.approval}` : `q${c.dataset.question}`).join(",");
  if (target.dataset.key !== key) {
    target.dataset.key = key;
    put(target, ...cards);
  }
  refreshInboxCount();
  return cards.length;
}

if (box) {
  const data = initialData();
  const show = async () => {
    try {
      empty.hidden = (await loadInbox(box)) > 0;
    } catch (err) {
      put(box, el("p", { class: "error" }, err.message));
    }
  };
  show();
  let timer = null;
  new ListStream({
    cursor: data.cursor,
    onTask: () => { clearTimeout(timer); timer = setTimeout(show, 150); },
    onStatus: statusBadge(document.getElementById("stream-status")),
  }).start();
}
