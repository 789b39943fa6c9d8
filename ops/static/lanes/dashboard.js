// Refreshes the dashboard's live part without reloading the page: fetches the
// server-rendered HTML (tables and SVG charts) from the data endpoint.
(function () {
  "use strict";
  var live = document.getElementById("dashboard-live");
  var status = document.getElementById("dashboard-status");
  if (!live) { return; }
  var url = live.getAttribute("data-url");
  var interval = parseInt(live.getAttribute("data-interval"), 10) || 3000;
  var busy = false;

  function setStatus(text, bad) {
    if (!status) { return; }
    status.textContent = text;
    status.className = bad ? "stale" : "";
  }

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) {
        var type = response.headers.get("Content-Type") || "";
        if (!response.ok || type.indexOf("application/json") === -1) {
          // A redirect to the login page answers HTML: the session ended.
          throw new Error(response.ok ? "logged out: reload the page to log in" : "HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (body) {
        live.innerHTML = body.html;
        live.setAttribute("data-refreshed", String(body.data.generated_at));
        setStatus("live, updated " + new Date().toLocaleTimeString(), false);
      })
      .catch(function (err) { setStatus("not updating: " + err.message, true); })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, interval);
  document.addEventListener("visibilitychange", refresh);
})();
