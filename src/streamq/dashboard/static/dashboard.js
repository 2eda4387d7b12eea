// streamq dashboard: live refresh by fragment swap, and the token remembered per tab.
// No build step and no dependency; the pages work without it (they just do not refresh).
(function () {
  "use strict";
  var every = parseInt(document.body.getAttribute("data-refresh-ms") || "0", 10);
  var targets = document.querySelectorAll("[data-refresh]");

  function refresh(el) {
    fetch(el.getAttribute("data-refresh"), { headers: { Accept: "text/html" }, cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) { el.innerHTML = html; } })
      .catch(function () { /* Redis or the dashboard is down: keep the last figures */ });
  }

  if (every > 0 && targets.length) {
    setInterval(function () {
      if (document.hidden) { return; }
      targets.forEach(refresh);
    }, every);
  }

  // The token lives in this tab's sessionStorage only: never in a cookie, never in a URL.
  var KEY = "streamq-dashboard-token";
  var saved = null;
  try { saved = window.sessionStorage.getItem(KEY); } catch (e) { saved = null; }
  document.querySelectorAll("input[name=token]").forEach(function (input) {
    if (saved && !input.value) { input.value = saved; }
  });
  document.addEventListener("submit", function (event) {
    var input = event.target.querySelector("input[name=token]");
    if (input && input.value) {
      try { window.sessionStorage.setItem(KEY, input.value); } catch (e) { /* private mode */ }
    }
  });
  var reason = document.getElementById("reason");
  if (reason && reason.form) {
    reason.addEventListener("change", function () { reason.form.submit(); });
  }
})();
