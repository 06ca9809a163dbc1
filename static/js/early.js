// Loaded before the page is parsed (a classic script, not a module). The page's own module runs
// only after parsing, and until then a form it handles (one without an action) would submit as
// a plain reload of the page and lose what was typed. A submit in that window is held and sent
// again once the page is ready, so an early tap on a slow phone is neither lost nor a reload.
(() => {
  let held = null;
  const hold = (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || form.hasAttribute("action") || form.method === "dialog") return;
    event.preventDefault();
    event.stopImmediatePropagation();
    held = form;
  };
  document.addEventListener("submit", hold, true);
  // Module scripts have all run when DOMContentLoaded fires.
  document.addEventListener("DOMContentLoaded", () => {
    document.removeEventListener("submit", hold, true);
    if (held && held.isConnected) held.requestSubmit();
  });
})();
