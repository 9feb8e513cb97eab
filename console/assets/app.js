// The console's live updates: one EventSource on /events, fed by the
// proxies' state events, the rotation's chart and the gateways' traffic.
// The proxies page updates its rows in place and adds new ones (on its
// first page) that match its filters; the rotation and traffic pages put
// each new picture in place; a "reload" event (the stream fell behind or
// started over) reads the page afresh.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var table = document.getElementById("proxies");
  var since = live.getAttribute("data-since") || "0";
  var want = "";
  if (document.getElementById("rotation-chart")) { want += "&want=rotation"; }
  if (document.getElementById("traffic")) { want += "&want=traffic"; }
  var es = new EventSource("/events?since=" + encodeURIComponent(since) + want);
  es.addEventListener("open", function () { live.textContent = "live"; });
  es.addEventListener("error", function () { live.textContent = "live: reconnecting"; });
  es.addEventListener("reload", function () { es.close(); window.location.reload(); });
  es.addEventListener("rotation", function (e) { chart(JSON.parse(e.data)); });
  es.addEventListener("traffic", function (e) { traffic(JSON.parse(e.data)); });
  es.addEventListener("proxy", function (e) {
    var p = JSON.parse(e.data);
    since = p.seq;
    if (table) { apply(p); }
  });
  function setText(id, v) {
    var el = document.getElementById(id);
    if (el) { el.textContent = String(v); }
  }
  // The rotation page: the server drew the chart; each "rotation" event
  // is the chart drawn afresh (its paths and numbers), put in place.
  function chart(c) {
    if (!document.getElementById("rotation-chart")) { return; }
    setText("rotation-now", c.size);
    setText("rotation-entries", c.entries);
    setText("rotation-exits", c.exits);
    setText("rotation-size-max", c.size_max);
    setText("rotation-bar-max", c.bar_max);
    setText("rotation-bar-min", c.bar_max);
    document.getElementById("rotation-size-path").setAttribute("d", c.size_path);
    document.getElementById("rotation-entry-path").setAttribute("d", c.entry_path);
    document.getElementById("rotation-exit-path").setAttribute("d", c.exit_path);
    var waiting = document.getElementById("rotation-waiting");
    if (waiting && c.ready) { waiting.remove(); }
  }
  // The traffic page: each "traffic" event is the table afresh.
  function traffic(t) {
    var tbl = document.getElementById("traffic");
    if (!tbl) { return; }
    setText("traffic-total", t.sum.total);
    var head = tbl.tHead.rows[0];
    head.textContent = "";
    ["gateway"].concat(t.outcomes, ["all", "rate 1m", "rate 5m", "read"]).forEach(function (h) {
      var th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    });
    var body = tbl.tBodies[0];
    body.textContent = "";
    function row(r, sum) {
      var tr = document.createElement("tr");
      if (sum) { tr.className = "sum"; tr.id = "traffic-sum"; } else { tr.setAttribute("data-gateway", r.gateway); }
      var td = document.createElement("td");
      td.textContent = r.gateway;
      if (r.error) {
        var e = document.createElement("span"); e.className = "error"; e.textContent = " " + r.error; td.appendChild(e);
      }
      tr.appendChild(td);
      r.counts.forEach(function (n, i) {
        var c = document.createElement("td"); c.className = "n"; c.setAttribute("data-outcome", t.outcomes[i]); c.textContent = String(n); tr.appendChild(c);
      });
      [r.total, r.rate_1m, r.rate_5m].forEach(function (v) {
        var c = document.createElement("td"); c.className = "n"; c.textContent = String(v); tr.appendChild(c);
      });
      var read = document.createElement("td"); read.textContent = sum ? "" : r.read; tr.appendChild(read);
      body.appendChild(tr);
    }
    (t.rows || []).forEach(function (r) { row(r, false); });
    row(t.sum, true);
  }
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
