// The live view of a task's kept browser (docs/internals/browser.md#a-person-steps-in): its page
// as it is now, streamed over /ws/tasks/<id>/browser/, and the owner's clicks, keys and text
// relayed into it. The box closes the stream with 4404 when the task keeps no browser: the
// view then hides itself until asked to look again.
import { el } from "./api.js";

const FINAL = new Set([4401, 4403, 4404, 4408]);
const MOVE_EVERY_MS = 50; // pointer moves are sent at most this often (hover menus still open)
const SPECIAL = new Set(["Enter", "Backspace", "Tab", "Escape", "Delete", "Home", "End", "PageUp", "PageDown",
  "ArrowLeft", "ArrowUp", "ArrowRight", "ArrowDown"]);

function wsUrl(path) {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${path}`;
}

function modifiers(event) {
  return (event.altKey ? 1 : 0) | (event.ctrlKey ? 2 : 0) | (event.metaKey ? 4 : 0) | (event.shiftKey ? 8 : 0);
}

export class BrowserView {
  constructor(taskId, { big = false } = {}) {
    this.taskId = taskId;
    this.size = { width: 1280, height: 900 };
    this.lastMove = 0;
    this.image = el("img", { class: "browser-frame", alt: "The task's browser, live", tabindex: "0", draggable: "false" });
    this.status = el("p", { class: "hint", "aria-live": "polite" }, "Connecting to the browser…");
    this.text = el("input", { type: "text", "aria-label": "Text to type into the page", autocomplete: "off" });
    const form = el("form", { class: "browser-type" },
      this.text,
      el("button", { type: "submit", class: big ? "big" : null }, "Type"),
      el("button", { type: "button", class: big ? "big" : null, "data-key": "Enter" }, "Enter"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (this.text.value) this.send({ type: "text", text: this.text.value.slice(0, 1000) });
      this.text.value = "";
    });
    form.querySelector("[data-key]").addEventListener("click", () => this.press("Enter"));
    this.node = el("section", { class: "card browser-view", "aria-label": "The task's browser", hidden: true },
      el("h2", {}, "The browser, live"),
      el("p", { class: "hint" }, "Click and type in the page to get past the wall, then continue the task."),
      this.image, form, this.status);
    this.listen();
  }

  start() {
    if (this.socket && this.socket.readyState <= 1) return this;
    this.stopped = false;
    const socket = new WebSocket(wsUrl(`/ws/tasks/${encodeURIComponent(this.taskId)}/browser/`));
    this.socket = socket;
    socket.onmessage = (message) => this.handle(JSON.parse(message.data));
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      if (FINAL.has(event.code) || this.stopped) {
        this.node.hidden = true;
        return;
      }
      this.status.textContent = "Reconnecting to the browser…";
      setTimeout(() => this.start(), 2000);
    };
    return this;
  }

  stop() {
    this.stopped = true;
    this.socket?.close();
    this.node.hidden = true;
  }

  handle(frame) {
    if (this.started && !this.node.isConnected) { // its card was drawn again without it
      this.stop();
      return;
    }
    this.started = true;
    if (frame.type === "ready") {
      this.node.hidden = false;
      this.status.textContent = "Live";
    } else if (frame.type === "frame") {
      this.size = { width: frame.width, height: frame.height };
      this.image.src = `data:image/jpeg;base64,${frame.data}`;
      this.node.hidden = false;
    } else if (frame.type === "error") {
      this.status.textContent = frame.error.message;
    } else if (frame.type === "closed") {
      this.status.textContent = frame.message;
    }
  }

  send(input) {
    if (this.socket?.readyState === 1) this.socket.send(JSON.stringify(input));
  }

  press(key) {
    this.send({ type: "key", action: "down", key });
    this.send({ type: "key", action: "up", key });
  }

  // Where on the page a pointer event is, in the page's CSS pixels.
  at(event) {
    const box = this.image.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * this.size.width;
    const y = ((event.clientY - box.top) / box.height) * this.size.height;
    return { x: Math.min(Math.max(x, 0), this.size.width), y: Math.min(Math.max(y, 0), this.size.height) };
  }

  listen() {
    const image = this.image;
    const button = (event) => ["left", "middle", "right"][event.button] ?? "left";
    image.addEventListener("contextmenu", (event) => event.preventDefault());
    image.addEventListener("pointerdown", (event) => {
      event.preventDefault();
      image.focus({ preventScroll: true }); // a scroll now would move the page under the pointer
      this.send({ type: "mouse", action: "down", ...this.at(event), button: button(event), clicks: 1, modifiers: modifiers(event) });
    });
    image.addEventListener("pointerup", (event) => {
      event.preventDefault();
      this.send({ type: "mouse", action: "up", ...this.at(event), button: button(event), clicks: 1, modifiers: modifiers(event) });
    });
    image.addEventListener("pointermove", (event) => {
      const now = Date.now();
      if (now - this.lastMove < MOVE_EVERY_MS) return;
      this.lastMove = now;
      this.send({ type: "mouse", action: "move", ...this.at(event), modifiers: modifiers(event) });
    });
    image.addEventListener("wheel", (event) => {
      event.preventDefault();
      const clamp = (v) => Math.max(-10000, Math.min(10000, v));
      this.send({ type: "mouse", action: "wheel", ...this.at(event), deltaX: clamp(event.deltaX), deltaY: clamp(event.deltaY) });
    }, { passive: false });
    for (const [type, action] of [["keydown", "down"], ["keyup", "up"]]) {
      image.addEventListener(type, (event) => {
        if (event.key.length !== 1 && !SPECIAL.has(event.key)) return;
        event.preventDefault();
        this.send({ type: "key", action, key: event.key, code: event.code.slice(0, 32), modifiers: modifiers(event) });
      });
    }
    image.addEventListener("paste", (event) => {
      const text = event.clipboardData?.getData("text") ?? "";
      if (text) {
        event.preventDefault();
        this.send({ type: "text", text: text.slice(0, 1000) });
      }
    });
  }
}
