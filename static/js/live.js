// Live streams from the box (docs/internals/live-log.md#live-updates). The database's order is the truth: a task stream
// delivers events strictly in seq order, fills any gap from the REST log, and reconnects with
// its last seq so nothing is lost or repeated. The list stream reconnects with its cursor.

import { api } from "./api.js";

const FINAL_CLOSE = new Set([4400, 4401, 4403]);

function wsUrl(path) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}${path}`;
}

class Stream {
  constructor(onStatus) {
    this.onStatus = onStatus ?? (() => {});
    this.delay = 500;
    this.stopped = false;
    this.queue = Promise.resolve();
  }

  start() {
    this.connect();
    return this;
  }

  stop() {
    this.stopped = true;
    this.socket?.close();
  }

  connect() {
    if (this.stopped) return;
    const socket = new WebSocket(wsUrl(this.path()));
    this.socket = socket;
    socket.onopen = () => { this.delay = 500; this.onStatus("live"); };
    socket.onmessage = (message) => {
      const frame = JSON.parse(message.data);
      // One frame at a time, so a gap fill finishes before later frames are looked at.
      this.queue = this.queue.then(() => this.handle(frame)).catch((err) => console.error(err));
    };
    socket.onclose = (event) => {
      if (this.stopped) return;
      if (FINAL_CLOSE.has(event.code)) {
        this.onStatus("denied");
        return;
      }
      this.onStatus("reconnecting");
      setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 10000);
    };
  }
}

export class TaskStream extends Stream {
  constructor(taskId, { after = 0, onEvent, onTask, onStatus } = {}) {
    super(onStatus);
    this.taskId = taskId;
    this.last = after;
    this.onEvent = onEvent ?? (() => {});
    this.onTask = onTask ?? (() => {});
  }

  path() {
    return `/ws/tasks/${encodeURIComponent(this.taskId)}/?after=${this.last}`;
  }

  async handle(frame) {
    if (frame.type === "event") {
      const seq = frame.event.seq;
      if (seq <= this.last) return; // already shown
      if (seq > this.last + 1) await this.fillGap(seq - 1);
      if (seq === this.last + 1) this.deliver(frame.event);
    } else if (frame.type === "task") {
      this.onTask(frame.task);
    }
  }

  deliver(event) {
    this.last = event.seq;
    this.onEvent(event);
  }

  // A frame arrived ahead of the ones before it: read the missing part of the log over REST.
  async fillGap(upTo) {
    while (this.last < upTo) {
      const page = await api("GET", `/api/tasks/${encodeURIComponent(this.taskId)}/events?after=${this.last}&limit=1000`);
      for (const event of page.events) if (event.seq === this.last + 1) this.deliver(event);
      if (!page.more) break;
    }
  }
}

export class ListStream extends Stream {
  constructor({ cursor = null, onTask, onStatus } = {}) {
    super(onStatus);
    this.cursor = cursor;
    this.onTask = onTask ?? (() => {});
  }

  path() {
    return this.cursor === null ? "/ws/tasks/" : `/ws/tasks/?after=${this.cursor}`;
  }

  async handle(frame) {
    if (frame.type === "task") this.onTask(frame.task);
    if (typeof frame.cursor === "number") this.cursor = frame.cursor;
  }
}

export function statusBadge(node) {
  return (status) => {
    if (!node) return;
    node.dataset.status = status;
    node.textContent = { live: "Live", reconnecting: "Reconnecting…", denied: "Not signed in" }[status] ?? status;
  };
}
