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
  // A role's log page follows its log instead: the relay's text appended as text, the oldest
  // pieces dropped past a bound, and no refresh of the page (which would drop the lines).
  var log = document.querySelector("pre[data-log-src]");
  if (log) {
    follow(log);
    return;
  }
  function follow(pre) {
    var decoder = new TextDecoder();
    var kept = 2000;
    live.textContent = "Following the log";
    fetch(pre.dataset.logSrc, { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok || !r.body) {
          throw new Error("status " + r.status);
        }
        var reader = r.body.getReader();
        function more() {
          return reader.read().then(function (piece) {
            if (piece.done) {
              live.textContent = "The log stream ended: reload the page to follow again";
              return;
            }
            pre.appendChild(document.createTextNode(decoder.decode(piece.value, { stream: true })));
            while (pre.childNodes.length > kept) {
              pre.removeChild(pre.firstChild);
            }
            return more();
          });
        }
        return more();
      })
      .catch(function () {
        live.textContent = "The log stream failed: reload the page to try again";
      });
  }
  var timer = null;
  // What identifies a control across two copies of a page.
  function keyOf(e) {
    return [e.tagName, e.id, e.getAttribute("href") || "", e.getAttribute("name") || "", e.textContent.trim()].join("|");
  }
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
          var focused = document.activeElement && main.contains(document.activeElement) ? keyOf(document.activeElement) : "";
          var adopted = document.importNode(fresh, true);
          main.replaceWith(adopted);
          main = adopted;
          // Keyboard users keep their place: the same control in the fresh copy gets focus.
          if (focused) {
            var same = Array.prototype.find.call(main.querySelectorAll("a, button, input, select, textarea, [tabindex]"), function (e) {
              return keyOf(e) === focused;
            });
            if (same) {
              same.focus();
            }
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
  var source = null;
  function connect() {
    source = new EventSource("/ui/live?after=" + encodeURIComponent(after));
    source.onopen = function () {
      live.textContent = "Live";
    };
    source.onmessage = function (e) {
      after = e.lastEventId || after;
      clearTimeout(timer);
      timer = setTimeout(refresh, 100);
    };
    source.onerror = function () {
      // A refused stream (this session has as many open pages as it may) is not retried by
      // the browser: say so instead of promising a reconnection.
      live.textContent = source.readyState === EventSource.CLOSED ? "Live updates off: close another page of the view, then reload this one" : "Live: reconnecting";
    };
  }
  // A page left for another closes its stream: pages kept for the back button would otherwise
  // hold theirs open (a session's streams are limited; over HTTP/1.1, a browser's six
  // connections to a host too).
  window.addEventListener("pagehide", function () {
    if (source) {
      source.close();
      source = null;
    }
  });
  window.addEventListener("pageshow", function (e) {
    if (e.persisted && !source) {
      connect();
      refresh();
    }
  });
  connect();
})();
