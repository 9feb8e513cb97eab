// The console's live updates: one EventSource on /events, fed by the
// proxies' state events. The proxies page updates its rows in place and
// adds new ones (on its first page) that match its filters; a "reload"
// event (the stream fell behind or started over) reads the page afresh.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var table = document.getElementById("proxies");
  var since = live.getAttribute("data-since") || "0";
  var es = new EventSource("/events?since=" + encodeURIComponent(since));
  es.addEventListener("open", function () { live.textContent = "live"; });
  es.addEventListener("error", function () { live.textContent = "live: reconnecting"; });
  es.addEventListener("reload", function () { es.close(); window.location.reload(); });
  es.addEventListener("proxy", function (e) {
    var p = JSON.parse(e.data);
    since = p.seq;
    if (table) { apply(p); }
  });
  function matches(p) {
    var host = table.getAttribute("data-host"), state = table.getAttribute("data-state"), pool = table.getAttribute("data-pool");
    if (host && p.host !== host) { return false; }
    if (pool && p.pool !== pool) { return false; }
    if (state && p.state !== state) { return false; }
    return p.state !== "deleted";
  }
  function cells(p) {
    return [p.id, p.state, p.host, p.addr, p.egress, p.health, p.pool, p.labels, p.age];
  }
  function fill(tr, p) {
    var vs = cells(p);
    while (tr.children.length < vs.length) { tr.appendChild(document.createElement("td")); }
    for (var i = 0; i < vs.length; i++) { tr.children[i].textContent = vs[i] || "-"; }
    tr.children[1].className = "state-" + p.state;
  }
  function apply(p) {
    var tbody = table.tBodies[0];
    var tr = tbody.querySelector('tr[data-id="' + CSS.escape(p.id) + '"]');
    var count = document.getElementById("proxy-count");
    if (tr) {
      if (!matches(p) && p.state === "deleted") {
        tr.remove();
        if (count) { count.textContent = String(Number(count.textContent) - 1); }
        return;
      }
      fill(tr, p);
      return;
    }
    if (!matches(p) || table.getAttribute("data-first") !== "true") { return; }
    tr = document.createElement("tr");
    tr.setAttribute("data-id", p.id);
    tr.className = "new";
    fill(tr, p);
    tbody.insertBefore(tr, tbody.firstChild);
    if (count) { count.textContent = String(Number(count.textContent) + 1); }
  }
})();
