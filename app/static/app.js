/* attnboard's own script: copy buttons, charts fed by SSE metric events, and a guard that keeps a
   reconnecting event stream from showing anything twice. No inline scripts anywhere (CSP). */
(function () {
  "use strict";

  var PALETTE = ["#2f5bd3", "#d3542f", "#1b7f3b", "#8a3fd1", "#c28f00", "#0f8a8a", "#b3261e", "#5b6677"];

  /* ---- a 422 answer to an htmx request is the form again, its problems shown beside the inputs
     (an import that failed, an export of a form with errors), and a 401 the same form asking to sign in
     (its text kept): swap them in like a 200. */
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (event.detail.xhr && (event.detail.xhr.status === 422 || event.detail.xhr.status === 401)) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  /* ---- copy to clipboard: <button data-copy="#selector"> */
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.value !== undefined ? source.value : source.textContent;
    var done = function (label) {
      var original = button.getAttribute("data-label") || button.textContent;
      button.setAttribute("data-label", original);
      button.textContent = label;
      window.setTimeout(function () { button.textContent = original; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done("Copied"); }, function () { done("Copy failed"); });
    } else {
      var area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      try { document.execCommand("copy"); done("Copied"); } catch (e) { done("Copy failed"); }
      area.remove();
    }
  });

  /* ---- charts */
  function readJson(selector) {
    var node = document.querySelector(selector);
    if (!node) return null;
    try { return JSON.parse(node.textContent); } catch (e) { return null; }
  }

  /* Steps are whole numbers: no 1.5 on the x axis. */
  function stepTicks(u, splits) {
    return splits.map(function (v) { return Number.isInteger(v) ? String(v) : ""; });
  }

  /* Values from 1e-9 (log-prob differences) to 1e4 (tokens/s) stay readable: three significant digits. */
  function valueTicks(u, splits) {
    return splits.map(function (v) {
      if (v === 0) return "0";
      var a = Math.abs(v);
      return a < 1e-3 || a >= 1e5 ? v.toExponential(1) : String(Number(v.toPrecision(3)));
    });
  }

  function plot(el, x, series) {
    if (el._plot) { el._plot.destroy(); el._plot = null; }
    var body = el.querySelector(".plot") || el;
    var empty = el.querySelector(".empty");
    if (!x.length || !series.length) { if (empty) empty.hidden = false; return; }
    if (empty) empty.hidden = true;
    var opts = {
      width: Math.max(280, body.clientWidth || 400),
      height: 190,
      scales: { x: { time: false } },
      axes: [{ label: "step", values: stepTicks }, { values: valueTicks, size: 64 }],
      legend: { live: false },
      series: [{ label: "step" }].concat(series.map(function (s, i) {
        return { label: s.label, stroke: PALETTE[i % PALETTE.length], width: 2, points: { show: x.length < 40 } };
      }))
    };
    el._plot = new window.uPlot(opts, [x].concat(series.map(function (s) { return s.values; })), body);
    el.setAttribute("data-points", String(x.length));
  }

  /* Live charts: each chart draws the metric names in its data-keys (JSON list), in that order, plus
     every per-rank value whose name starts with its data-per-rank ("peak_memory_mb/rank "). */
  function LiveCharts(root, points) {
    this.charts = Array.prototype.slice.call(root.querySelectorAll(".chart[data-keys]"));
    this.rows = [];
    this.steps = {};
    for (var i = 0; i < points.length; i++) this.add(points[i], true);
    this.draw();
  }
  LiveCharts.prototype.add = function (point, quiet) {
    if (!point || typeof point.step !== "number" || this.steps[point.step]) return;
    this.steps[point.step] = true;
    this.rows.push(point);
    this.rows.sort(function (a, b) { return a.step - b.step; });
    if (!quiet) this.draw();
  };
  function chartKeys(el, rows) {
    var wanted = [];
    try { wanted = JSON.parse(el.getAttribute("data-keys") || "[]"); } catch (e) { wanted = []; }
    var prefix = el.getAttribute("data-per-rank");
    var present = {};
    rows.forEach(function (r) {
      Object.keys(r.values || {}).forEach(function (k) { if (typeof r.values[k] === "number") present[k] = true; });
    });
    var keys = wanted.filter(function (k) { return present[k]; });
    if (prefix) {
      keys = keys.concat(Object.keys(present).filter(function (k) { return k.indexOf(prefix) === 0; }).sort());
    }
    return keys;
  }
  LiveCharts.prototype.draw = function () {
    var rows = this.rows;
    var x = rows.map(function (r) { return r.step; });
    this.charts.forEach(function (el) {
      plot(el, x, chartKeys(el, rows).map(function (k) {
        return { label: k, values: rows.map(function (r) { var v = r.values[k]; return typeof v === "number" ? v : null; }) };
      }));
    });
  };

  function setup(root) {
    var live = root.querySelector ? root.querySelector("[data-live-charts]") : null;
    if (live && !live._charts) {
      live._charts = new LiveCharts(live, readJson(live.getAttribute("data-live-charts")) || []);
    }
    var statics = root.querySelectorAll ? root.querySelectorAll(".chart[data-static]") : [];
    Array.prototype.forEach.call(statics, function (el) {
      if (el._plot) return;
      var data = readJson(el.getAttribute("data-static"));
      if (data) plot(el, data.x || [], data.series || []);
    });
  }

  /* ---- the event stream: resume without repeats */
  var highWater = {};  // per stream element: the highest seq already shown

  document.addEventListener("htmx:sseOpen", function (event) {
    var elt = event.target;
    var source = event.detail && event.detail.source;
    if (!source || source._attnboardWired) return;
    source._attnboardWired = true;
    source.addEventListener("metric", function (message) {
      if (!accept(elt, message)) return;
      var live = document.querySelector("[data-live-charts]");
      if (!live || !live._charts) return;
      try { live._charts.add(JSON.parse(message.data)); } catch (e) { /* a malformed point is skipped */ }
    });
  });

  /* Appending kinds are shown once per seq: a reconnect (with or without Last-Event-ID) may resend
     what the page already has. Replacing kinds (status, attention, progress) are idempotent. */
  var APPEND = { log: true, trouble: true, metric: true };
  function accept(elt, message) {
    if (!APPEND[message.type]) return true;
    var seq = parseInt(message.lastEventId, 10);
    if (isNaN(seq)) return true;
    var mark = (elt.id || "stream") + ":" + message.type;
    var last = highWater[mark] !== undefined ? highWater[mark] : parseInt(elt.getAttribute("data-last-seq") || "0", 10);
    if (seq <= last) return false;
    highWater[mark] = seq;
    return true;
  }

  /* Appending swaps (the log) must not repeat a seq the page already shows. */
  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var message = event.detail;
    if (!message || message.type === "metric") return;
    var stream = event.target.closest("[sse-connect]");
    if (stream && !accept(stream, message)) event.preventDefault();
  });

  document.addEventListener("DOMContentLoaded", function () { setup(document); });
  document.addEventListener("htmx:load", function (event) { setup(event.target); });
})();
