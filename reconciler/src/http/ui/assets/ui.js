// Pushleft's web view: live updates. Every page is whole without this script. With it, when
// the control plane records an event, the page fetches itself again and swaps its <main> for
// the fresh one (HTML the server escaped; no event text is ever read here).
(function () {
  "use strict";
  var body = document.body;
  var main = document.getElementById("main");
  var live = document.getElementById("live");
  if (!main || !live || !window.EventSource || body.dataset.live !== "on") {
    return;
  }
  var timer = null;
  var busy = false;
  var again = false;
  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(location.href, { credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("status " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        if (fresh && fresh.innerHTML !== main.innerHTML) {
          var focused = document.activeElement && main.contains(document.activeElement) ? document.activeElement.id : "";
          var adopted = document.importNode(fresh, true);
          main.replaceWith(adopted);
          main = adopted;
          if (focused && document.getElementById(focused)) {
            document.getElementById(focused).focus();
          }
        }
        live.textContent = "Live: updated at " + new Date().toLocaleTimeString();
      })
      .catch(function () {
        live.textContent = "Live updates paused: reload the page";
      })
      .finally(function () {
        busy = false;
        if (again) {
          again = false;
          refresh();
        }
      });
  }
  var after = body.dataset.after || "0";
  var source = new EventSource("/ui/live?after=" + encodeURIComponent(after));
  source.onopen = function () {
    live.textContent = "Live";
  };
  source.onmessage = function () {
    clearTimeout(timer);
    timer = setTimeout(refresh, 100);
  };
  source.onerror = function () {
    live.textContent = "Live: reconnecting";
  };
})();
