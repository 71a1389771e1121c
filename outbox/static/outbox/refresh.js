// Auto-refresh of the outbox console pages: a checkbox #auto-refresh (data-seconds), remembered in
// localStorage. The reload waits while the page is in use: a focused field, checked rows, an open
// error, selected text, or a hidden tab. No library.
(function () {
  "use strict";
  var box = document.getElementById("auto-refresh");
  if (!box) return;
  var state = document.getElementById("auto-refresh-state");
  var key = "outbox.autoRefresh";
  function period() { return (parseFloat(box.getAttribute("data-seconds")) || 15) * 1000; }
  var timer = null;
  try { box.checked = window.localStorage.getItem(key) === "on"; } catch (e) { /* storage off */ }

  function say(text) { if (state) state.textContent = text; }

  function busy() {
    var el = document.activeElement;
    if (el && el !== box && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(el.tagName)) return true;
    if (document.querySelector("input.action-select:checked, #action-toggle:checked")) return true;
    if (document.querySelector("details.outbox-error-details[open]")) return true;
    var sel = window.getSelection && window.getSelection();
    return !!(sel && String(sel).length);
  }

  function schedule() {
    window.clearTimeout(timer);
    if (box.checked) timer = window.setTimeout(tick, period());
    else say("");
  }

  function tick() {
    if (!box.checked) return;
    if (document.hidden || busy()) {
      say("paused while the page is in use");
      schedule();
      return;
    }
    say("refreshing…");
    window.location.reload();
  }

  box.addEventListener("change", function () {
    try { window.localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) { /* storage off */ }
    say(box.checked ? "on" : "");
    schedule();
  });
  if (box.checked) say("on");
  schedule();
})();
