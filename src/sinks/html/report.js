// fragscope HTML report: draws the page from the JSON in #fragscope-data (written by
// src/sinks/html/html_report.cc; docs/report.md). Plain canvas, no library, no network.
// window.fragscopeReport exposes the state the browser test (tests/browser) reads.
'use strict';
(function () {
  const T0 = performance.now();
  const api = (window.fragscopeReport = { ready: false, errors: [], timings: {} });
  const D = JSON.parse(document.getElementById('fragscope-data').textContent);
  unpackPage(D);
  const app = document.getElementById('app');
  const COLORS = {
    reserved: '#1f77b4', allocated: '#2ca02c', requested: '#9467bd', cached_free: '#ff7f0e',
    largest_free_block: '#8c564b', max_allocatable: '#17becf', fragmentation: '#e15759',
  };
  const STATE = ['free', 'allocated', 'pending free', 'stranded (free, too small)'];
  const STATE_COLOR = ['#cfd4dc', '#4e79a7', '#f28e2b', '#e15759'];
  const BS = 5;  // numbers per block in a map: offset, size, requested, state, allocation
  const HIGHLIGHT = '#f1c40f';  // blocks that match the search
  const SITE_COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];
  const RISK_COLOR = { ok: '#2ca02c', watch: '#bcbd22', warning: '#ff7f0e', critical: '#d62728', unknown: '#c7c7c7' };

  // ---- formatting ----
  // The rounding of the text report and the verdict (FormatBytes in src/common/units.cc): one
  // decimal in KiB and MiB, two in GiB, and an exact tie goes to the even digit (as C++'s
  // formatting of the exact binary value does), so a figure reads the same everywhere.
  function fixed(v, d) {
    const m = Math.pow(10, d), s = v * m, f = Math.floor(s);
    const r = s - f === 0.5 ? (f % 2 === 0 ? f : f + 1) : Math.round(s);
    return (r / m).toFixed(d);
  }
  function bytes(n) {
    if (n === null || n === undefined) return '–';
    const a = Math.abs(n), sign = n < 0 ? '-' : '';
    if (a < 1024) return String(n) + ' B';
    if (a < 1048576) return sign + fixed(a / 1024, 1) + ' KiB';
    if (a < 1073741824) return sign + fixed(a / 1048576, 1) + ' MiB';
    return sign + fixed(a / 1073741824, 2) + ' GiB';
  }
  function num(n) { return Number(n).toLocaleString('en-US'); }
  function hex(n) { return '0x' + Number(n).toString(16); }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === 'class') e.className = attrs[k];
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), attrs[k]);
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of kids) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }
  function siteName(id) { return D.sites[String(id)] || 'frame ' + id; }
  function stepText(s) { return s >= 0 ? 'step ' + num(s) : 'before the first step'; }
  function niceStep(range, ticks) {
    const raw = range / ticks, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
  }
  function niceBytesStep(range, ticks) {
    const raw = range / ticks;
    let unit = 1;
    while (raw / unit >= 1024) unit *= 1024;
    return niceStep(raw * ticks / unit, ticks) * unit;
  }
  function setupCanvas(c, cssHeight) {
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 800;
    c.style.height = cssHeight + 'px';
    c.width = Math.round(w * dpr);
    c.height = Math.round(cssHeight * dpr);
    const g = c.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { g, w, h: cssHeight };
  }

  // ---- packed numbers (src/sinks/html/packed_ints.h; docs/report.md, "The embedded data") ----
  // Base-64 digits of 5 bits each, least significant first; a digit >= 32 says more follow.
  // Arithmetic, not bit operations: addresses need more than 32 bits.
  function unpackInts(text) {
    const out = [];
    let v = 0, m = 1;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      const d = c >= 97 ? c - 71 : c === 95 ? 63 : c >= 65 ? c - 65 : c >= 48 ? c + 4 : 62;  // a-z, _, A-Z, 0-9, -
      if (d >= 32) { v += (d - 32) * m; m *= 32; } else { out.push(v + d * m); v = 0; m = 1; }
    }
    return out;
  }
  function unzigzag(u) { return u % 2 ? -(u + 1) / 2 : u / 2; }
  // The page's packed tables back into arrays: allocations' columns, stacks, segment rows.
  function unpackPage(data) {
    if (typeof data.stacks === 'string') {
      const u = unpackInts(data.stacks), stacks = [];
      for (let i = 0; i < u.length; i += 1 + u[i]) stacks.push(u.slice(i + 1, i + 1 + u[i]));
      data.stacks = stacks;
    }
    for (const d of data.devices || []) {
      const rows = unpackInts(d.segments || ''), table = [];
      for (let i = 0; i + 5 <= rows.length; i += 5) table.push(rows.slice(i, i + 5));
      d.segmentRows = table;
      if (d.allocs) d.allocs = unpackAllocations(d.allocs);
    }
  }
  // alloc_*: running sums of zigzagged changes; free_*: 0 for -1, else 1 + the zigzag of the
  // difference from the alloc column; site and stack zigzagged.
  function unpackAllocations(P) {
    const running = (t) => {
      if (t === null) return null;
      const u = unpackInts(t);
      let last = 0;
      for (let i = 0; i < u.length; i++) u[i] = last = last + unzigzag(u[i]);
      return u;
    };
    const after = (t, from) => {
      if (t === null) return null;
      const u = unpackInts(t);
      for (let i = 0; i < u.length; i++) u[i] = u[i] === 0 ? -1 : (from ? from[i] : -1) + unzigzag(u[i] - 1);
      return u;
    };
    const signed = (t) => unpackInts(t).map(unzigzag);
    const A = { alloc_event: running(P.alloc_event), alloc_step: running(P.alloc_step), alloc_time: running(P.alloc_time) };
    A.free_event = after(P.free_event, A.alloc_event);
    A.free_step = after(P.free_step, A.alloc_step);
    A.free_time = after(P.free_time, A.alloc_time);
    A.stream = unpackInts(P.stream);
    A.site = signed(P.site);
    A.stack = signed(P.stack);
    return A;
  }
  // One frame's segments as [addr, size, stream, pool, expandable, blocks] with blocks a flat
  // list of BS numbers each (offset, size, requested, state, allocation); `prev`: the previous
  // frame's, `table`: the device's segment rows.
  function unpackSegments(text, prev, table) {
    const u = unpackInts(text), out = [];
    for (let i = 0; i < u.length;) {
      const tag = u[i++];
      if (tag % 2) { out.push(prev[(tag - 1) / 2]); continue; }
      const row = table[tag / 2], n = u[i++], b = new Array(n * BS);
      let end = 0;
      for (let j = 0; j < n; j++, i += 4) {
        const off = end + unzigzag(u[i]), sc = u[i + 1], size = sc % 2 ? (sc - 1) / 2 : (sc / 2) * 512;
        const sa = u[i + 2], state = sa % 4, held = state === 1 || state === 2;
        b[j * BS] = off;
        b[j * BS + 1] = size;
        b[j * BS + 2] = (held ? size : 0) - unzigzag(u[i + 3]);
        b[j * BS + 3] = state;
        b[j * BS + 4] = (sa - state) / 4 - 1;
        end = off + size;
      }
      out.push([row[0], row[1], row[2], row[3], row[4], b]);
    }
    return out;
  }

  // ---- state ----
  let dev = null;        // the device shown
  let view = null;       // [x0, x1] event range shown in the charts
  let moment = null;     // event index chosen for the map
  let frameIndex = -1;   // frame of the map
  let resolved = [];     // resolved segment lists per frame of `dev`
  const hidden = {};     // series switched off in the legend
  let xAxis = 'events';  // how the charts' x axis is labelled: 'events', 'steps' or 'seconds'
  let xAxisPicked = false;  // chosen in the page (kept across devices that offer it)

  // A frame's segments, unpacked (unpackSegments) in order: a frame names an unchanged segment
  // by its index in the previous frame.
  function segmentsOf(i) {
    if (resolved[i]) return resolved[i];
    const prev = i > 0 ? segmentsOf(i - 1) : [];
    resolved[i] = unpackSegments(dev.frames[i].segs, prev, dev.segmentRows);
    return resolved[i];
  }

  function riskPoints(d) {
    if (!d.forecast) return [];
    const s = d.series, out = [];
    for (const c of d.forecast.changes) {
      let i = 0;
      while (i < s.step_last.length && s.step_last[i] < c.step) i++;
      if (i >= s.end_event.length) i = s.end_event.length - 1;
      // The level holds from the start of the sample that gave it.
      if (i >= 0) out.push({ x: s.first_event[i], level: c.level, c });
    }
    return out;
  }

  // ---- charts ----
  // Draws series over [view] with one min/max segment per pixel column, so that no peak of a
  // long run is lost however many samples fall into one column.
  function drawChart(canvas, spec) {
    const t = performance.now();
    const { g, w, h } = setupCanvas(canvas, spec.height);
    const L = 70, R = 10, TOP = 8, B = AXIS_B, pw = w - L - R, ph = h - TOP - B;
    const xs = dev.series.end_event, n = xs.length;
    const [x0, x1] = view;
    const X = (x) => L + ((x - x0) / Math.max(1, x1 - x0)) * pw;
    let ymax = spec.ymax || 0;
    const lo = lowerBound(xs, x0), hi = Math.min(n, lowerBound(xs, x1) + 1);
    if (!spec.ymax) {
      for (const s of spec.series) {
        if (hidden[s.key]) continue;
        const ys = dev.series[s.key];
          const ps = s.peak ? dev.series[s.peak] : ys;
        for (let i = Math.max(0, lo - 1); i < hi; i++) if (ps[i] > ymax) ymax = ps[i];
      }
      if (spec.cap) ymax = Math.max(ymax, spec.cap);
      if (ymax <= 0) ymax = 1;
      ymax *= 1.05;
    }
    const Y = (v) => TOP + ph - (v / ymax) * ph;
    g.clearRect(0, 0, w, h);
    g.font = '11px system-ui, sans-serif';
    g.fillStyle = '#5b6475';
    g.strokeStyle = '#eceef2';
    g.lineWidth = 1;
    const ystep = spec.bytes ? niceBytesStep(ymax, 4) : niceStep(ymax, 4);
    g.textAlign = 'right';
    for (let v = 0; v <= ymax; v += ystep) {
      g.beginPath(); g.moveTo(L, Y(v) + 0.5); g.lineTo(L + pw, Y(v) + 0.5); g.stroke();
      g.fillText(spec.bytes ? bytes(v) : spec.pct ? (v * 100).toFixed(0) + '%' : String(v), L - 4, Y(v) + 4);
    }
    xAxisLine(g, X, x0, x1, L, pw, h);
    if (spec.cap) {
      g.strokeStyle = '#999'; g.setLineDash([4, 3]);
      g.beginPath(); g.moveTo(L, Y(spec.cap)); g.lineTo(L + pw, Y(spec.cap)); g.stroke();
      g.setLineDash([]); g.textAlign = 'left'; g.fillText('capacity', L + 4, Y(spec.cap) - 3);
    }
    if (spec.risk) {
      const pts = riskPoints(dev);
      for (let k = 0; k < pts.length; k++) {
        const a = Math.max(L, X(pts[k].x)), b = Math.min(L + pw, k + 1 < pts.length ? X(pts[k + 1].x) : L + pw);
        if (b <= a) continue;
        g.fillStyle = RISK_COLOR[pts[k].level] || '#ccc';
        g.globalAlpha = 0.5; g.fillRect(a, TOP + ph - 8, b - a, 8); g.globalAlpha = 1;
      }
    }
    g.save();
    g.beginPath(); g.rect(L, TOP, pw, ph); g.clip();
    // One path per series through the state at the end of each sample, with one min/max
    // segment per pixel column; a faint second path through the peaks inside each sample,
    // so that no spike between two samples is lost however long the run.
    const path = (ys, width, alpha, dots) => {
      g.lineWidth = width;
      g.globalAlpha = alpha;
      g.beginPath();
      let col = null, cfirst = 0, cmin = 0, cmax = 0, clast = 0, started = false;
      const flush = () => {
        if (col === null) return;
        if (started) g.lineTo(col, Y(cfirst)); else { g.moveTo(col, Y(cfirst)); started = true; }
        g.lineTo(col, Y(cmin)); g.lineTo(col, Y(cmax)); g.lineTo(col, Y(clast));
      };
      for (let i = Math.max(0, lo - 1); i < hi; i++) {
        const c = Math.round(X(xs[i])), v = ys[i];
        if (c !== col) { flush(); col = c; cfirst = cmin = cmax = v; }
        if (v < cmin) cmin = v;
        if (v > cmax) cmax = v;
        clast = v;
      }
      flush();
      g.stroke();
      if (dots && hi - Math.max(0, lo - 1) < pw / 6) {  // few samples: mark each
        g.fillStyle = g.strokeStyle;
        for (let i = Math.max(0, lo - 1); i < hi; i++) {
          g.beginPath(); g.arc(X(xs[i]), Y(ys[i]), 2.5, 0, 7); g.fill();
        }
      }
      g.globalAlpha = 1;
    };
    for (const s of spec.series) {
      if (hidden[s.key]) continue;
      g.strokeStyle = COLORS[s.key] || '#333';
      if (s.peak) path(dev.series[s.peak], 1, 0.3, false);
      path(dev.series[s.key], 1.5, 1, true);
    }
    g.restore();
    for (const o of dev.ooms) {
      const x = X(o.event);
      if (x < L || x > L + pw) continue;
      g.strokeStyle = '#d62728'; g.lineWidth = 2;
      g.beginPath(); g.moveTo(x, TOP); g.lineTo(x, TOP + ph); g.stroke();
      g.fillStyle = '#d62728';
      g.textAlign = x > L + pw - 40 ? 'right' : 'left';
      g.fillText('OOM', x > L + pw - 40 ? x - 3 : x + 3, TOP + 10);
    }
    if (moment !== null) {
      const x = X(moment);
      if (x >= L && x <= L + pw) {
        g.strokeStyle = '#1d2330'; g.lineWidth = 1; g.setLineDash([3, 3]);
        g.beginPath(); g.moveTo(x + 0.5, TOP); g.lineTo(x + 0.5, TOP + ph); g.stroke(); g.setLineDash([]);
      }
    }
    if (spec.sel) {
      g.fillStyle = 'rgba(31,119,180,0.15)';
      g.fillRect(Math.min(spec.sel[0], spec.sel[1]), TOP, Math.abs(spec.sel[1] - spec.sel[0]), ph);
    }
    canvas._geom = { L, pw, x0, x1 };
    api.timings.lastChartMs = performance.now() - t;
  }

  function lowerBound(a, v) {
    let l = 0, r = a.length;
    while (l < r) { const m = (l + r) >> 1; if (a[m] < v) l = m + 1; else r = m; }
    return l;
  }

  // ---- x axis ----
  // The charts' x is always the event index (zoom, clicks and the map work in events); the axis
  // can be labelled in events, in steps (at the first event of each step's sample), or in
  // seconds since the input's first timed event, placed by the samples' times (each sample's
  // time is its last event's; between samples the time is interpolated).
  function timePoints(d) {
    const s = d.series;
    if (!s.time_us || D.first_time_us === null || D.first_time_us < 0) return null;
    const ev = [], t = [];
    let last = 0;
    for (let i = 0; i < s.end_event.length; i++) {
      const v = s.time_us[i];
      if (v === null || v < 0) continue;
      last = Math.max(last, (v - D.first_time_us) / 1e6);
      if (!ev.length) { ev.push(s.first_event[i]); t.push(0); }
      ev.push(s.end_event[i]); t.push(last);
    }
    return ev.length >= 2 && t[t.length - 1] > 0 ? { ev, t } : null;
  }
  // Piecewise linear: y at x over the points (xs ascending), clamped at the ends.
  function interp(xs, ys, x) {
    if (x <= xs[0]) return ys[0];
    if (x >= xs[xs.length - 1]) return ys[ys.length - 1];
    const i = lowerBound(xs, x);
    if (xs[i] === x) return ys[i];
    const a = i - 1, span = xs[i] - xs[a];
    return span > 0 ? ys[a] + (ys[i] - ys[a]) * (x - xs[a]) / span : ys[i];
  }
  function secondsText(v, stepSize) {
    const d = stepSize >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(stepSize)));
    return v.toFixed(d) + ' s';
  }
  function xTicks(x0, x1) {
    const out = [];
    if (xAxis === 'seconds' && dev.times) {
      // Times only grow with events: the inverse of event -> time is time -> event.
      const { ev, t } = dev.times;
      const t0 = interp(ev, t, x0), t1 = interp(ev, t, x1);
      if (t1 > t0) {
        const st = niceStep(t1 - t0, 6);
        const pos = [];
        for (let v = Math.ceil(t0 / st) * st; v <= t1 + st * 1e-9; v += st) pos.push(v);
        // An event for each tick time: the first sample time reaching it, interpolated.
        for (const v of pos) {
          let i = lowerBound(t, v);
          if (i >= t.length) i = t.length - 1;
          let x = ev[i];
          if (i > 0 && t[i] > t[i - 1]) x = ev[i - 1] + (ev[i] - ev[i - 1]) * (v - t[i - 1]) / (t[i] - t[i - 1]);
          if (x >= x0 && x <= x1) out.push({ x, label: secondsText(v, st) });
        }
        return out;
      }
    }
    if (xAxis === 'steps' && D.timeline_unit === 'step') {
      const s = dev.series;
      const lo = lowerBound(s.end_event, x0);
      let first = null, last = null;
      for (let i = lo; i < s.first_event.length && s.first_event[i] <= x1; i++) {
        if (s.step_first[i] < 0) continue;
        if (first === null) first = s.step_first[i];
        last = s.step_first[i];
      }
      if (first !== null) {
        const st = Math.max(1, niceStep(Math.max(1, last - first), 6));
        let bucket = null;
        for (let i = lo; i < s.first_event.length && s.first_event[i] <= x1; i++) {
          const k = s.step_first[i];
          if (k < 0 || s.first_event[i] < x0) continue;
          const b = Math.floor(k / st);
          if (b === bucket) continue;
          bucket = b;
          out.push({ x: s.first_event[i], label: num(k) });
        }
        return out;
      }
    }
    const xstep = niceStep(Math.max(1, x1 - x0), 6);
    for (let v = Math.ceil(x0 / xstep) * xstep; v <= x1; v += xstep) out.push({ x: v, label: num(v) });
    return out;
  }
  // Every chart's x axis says what it counts (issue 33 item 4): its tick labels, and under
  // them the axis title.
  const AXIS_B = 36;  // room under a chart for the ticks and the title
  function axisTitle() {
    return xAxis === 'seconds' ? 'time: seconds since the first event (wall clock)' :
      xAxis === 'steps' ? 'training step (tick at the first event of the step)' : 'event index (no times or steps drive this axis)';
  }
  function xAxisLine(g, X, x0, x1, L, pw, h) {
    g.fillStyle = '#5b6475';
    g.textAlign = 'center';
    for (const tk of xTicks(x0, x1)) g.fillText(tk.label, X(tk.x), h - 20);
    g.fillStyle = '#1d2330';
    g.fillText(axisTitle(), L + pw / 2, h - 4);
  }
  function xAxisChoices() {
    const c = [['events', 'event index']];
    if (D.timeline_unit === 'step') c.push(['steps', 'step']);
    if (dev.times) c.push(['seconds', 'seconds since the first event']);
    return c;
  }
  // The steps when the timeline follows them, else seconds when times are known.
  function defaultXAxis() {
    const ids = xAxisChoices().map((c) => c[0]);
    return ids.includes('steps') ? 'steps' : ids.includes('seconds') ? 'seconds' : 'events';
  }
  function timeText(us) {
    return us !== null && us >= 0 && D.first_time_us !== null && D.first_time_us >= 0 ?
      ', ' + ((us - D.first_time_us) / 1e6).toFixed(3) + ' s' : '';
  }

  const BYTE_SERIES = [
    { key: 'reserved', label: 'reserved', peak: 'peak_reserved' },
    { key: 'allocated', label: 'allocated', peak: 'peak_allocated' },
    { key: 'requested', label: 'requested', peak: 'peak_requested' }, { key: 'cached_free', label: 'cached free' },
    { key: 'largest_free_block', label: 'largest free block' },
    { key: 'max_allocatable', label: 'max allocatable' },
  ];
  let charts = [];

  function drawCharts(sel) {
    for (const c of charts) {
      const spec = Object.assign({}, c.spec, { sel: c.canvas === sel?.canvas ? sel.range : null });
      if (spec.kind === 'sites') drawSites(c.canvas, spec);
      else if (spec.kind === 'search') drawSearch(c.canvas, spec);
      else drawChart(c.canvas, spec);
    }
  }

  // A chart's frame over [view]: the y grid in bytes, the x ticks and axis title, the chosen
  // moment and a zoom selection drawn by `marks` afterwards. Returns the mapping.
  function plotArea(canvas, height, ymax) {
    const { g, w, h } = setupCanvas(canvas, height);
    const L = 70, R = 10, TOP = 8, pw = w - L - R, ph = h - TOP - AXIS_B;
    const [x0, x1] = view;
    const X = (x) => L + ((x - x0) / Math.max(1, x1 - x0)) * pw;
    const Y = (v) => TOP + ph - (v / ymax) * ph;
    g.clearRect(0, 0, w, h);
    g.font = '11px system-ui, sans-serif';
    g.fillStyle = '#5b6475';
    g.strokeStyle = '#eceef2';
    g.lineWidth = 1;
    g.textAlign = 'right';
    const ystep = niceBytesStep(ymax, 4);
    for (let v = 0; v <= ymax; v += ystep) {
      g.beginPath(); g.moveTo(L, Y(v) + 0.5); g.lineTo(L + pw, Y(v) + 0.5); g.stroke();
      g.fillText(bytes(v), L - 4, Y(v) + 4);
    }
    xAxisLine(g, X, x0, x1, L, pw, h);
    canvas._geom = { L, pw, x0, x1 };
    return { g, w, h, L, pw, TOP, ph, X, Y };
  }
  function marks(P, spec) {
    const { g, L, pw, TOP, ph, X } = P;
    if (moment !== null) {
      const x = X(moment);
      if (x >= L && x <= L + pw) {
        g.strokeStyle = '#1d2330'; g.lineWidth = 1; g.setLineDash([3, 3]);
        g.beginPath(); g.moveTo(x + 0.5, TOP); g.lineTo(x + 0.5, TOP + ph); g.stroke(); g.setLineDash([]);
      }
    }
    if (spec.sel) {
      g.fillStyle = 'rgba(31,119,180,0.15)';
      g.fillRect(Math.min(spec.sel[0], spec.sel[1]), TOP, Math.abs(spec.sel[1] - spec.sel[0]), ph);
    }
  }

  // ---- active memory by call site ----
  // Stacked: the live bytes of the top call sites and of all others at the end of each
  // sample (computed from every event by the report, not from the kept maps).
  function siteLayers() {
    const st = dev.site_timeline;
    if (!st) return [];
    return [...st.sites.map((id, i) => ({ name: siteName(id), values: st.bytes[i], color: SITE_COLORS[i % SITE_COLORS.length] })),
      { name: 'other call sites (and none recorded)', values: st.other, color: '#c7c7c7' }];
  }
  function drawSites(canvas, spec) {
    const xs = dev.series.end_event, n = xs.length, layers = siteLayers();
    const lo = Math.max(0, lowerBound(xs, view[0]) - 1), hi = Math.min(n, lowerBound(xs, view[1]) + 1);
    let ymax = 0;
    for (let i = lo; i < hi; i++) {
      let t = 0;
      for (const l of layers) t += l.values[i];
      if (t > ymax) ymax = t;
    }
    const P = plotArea(canvas, spec.height, ymax > 0 ? ymax * 1.05 : 1);
    const { g, L, TOP, pw, ph, X, Y } = P;
    g.save();
    g.beginPath(); g.rect(L, TOP, pw, ph); g.clip();
    // Each layer is the area under the sum of itself and the layers below it, painted from
    // the top one down.
    for (let k = layers.length - 1; k >= 0 && hi > lo; k--) {
      g.fillStyle = layers[k].color;
      g.beginPath();
      g.moveTo(X(xs[lo]), Y(0));
      for (let i = lo; i < hi; i++) {
        let c = 0;
        for (let j = 0; j <= k; j++) c += layers[j].values[i];
        g.lineTo(X(xs[i]), Y(c));
      }
      g.lineTo(X(xs[hi - 1]), Y(0));
      g.closePath();
      g.fill();
    }
    g.restore();
    marks(P, spec);
  }

  // ---- search ----
  // "attention", "model.py": blocks whose call site or stack (a frame's function or file)
  // contains the text; ">=64MiB", "<1MiB", "=512B": blocks of that size. Only blocks that hold
  // an allocation (allocated or pending free) match.
  let search = null;
  const UNITS = { b: 1, k: 1024, kib: 1024, kb: 1e3, m: 1048576, mib: 1048576, mb: 1e6, g: 1073741824, gib: 1073741824, gb: 1e9 };
  function parseSearch(text) {
    const q = text.trim();
    if (!q) return null;
    const m = /^(>=|<=|>|<|=)?\s*(\d+(?:\.\d+)?)\s*([kmg]?i?b|[kmg])?$/i.exec(q);
    if (m && (m[1] || m[3])) {
      const v = parseFloat(m[2]) * UNITS[(m[3] || 'b').toLowerCase()], op = m[1] || '=';
      const ok = op === '>=' ? (x) => x >= v : op === '<=' ? (x) => x <= v : op === '>' ? (x) => x > v : op === '<' ? (x) => x < v : (x) => x === v;
      return { q, test: (b, k) => (b[k + 3] === 1 || b[k + 3] === 2) && ok(b[k + 1]) };
    }
    const needle = q.toLowerCase(), bySite = new Map(), byStack = new Map();
    const siteHit = (id) => {
      if (!bySite.has(id)) bySite.set(id, id >= 0 && siteName(id).toLowerCase().includes(needle));
      return bySite.get(id);
    };
    const stackHit = (id) => {
      if (!byStack.has(id)) {
        byStack.set(id, (D.stacks[id] || []).some((f) => {
          const fr = D.stack_frames[f];
          return String(fr[0]).toLowerCase().includes(needle) || String(fr[1]).toLowerCase().includes(needle);
        }));
      }
      return byStack.get(id);
    };
    return {
      q, test: (b, k) => {
        if (b[k + 3] !== 1 && b[k + 3] !== 2) return false;
        const i = b[k + 4];
        if (i < 0) return false;
        return siteHit(dev.allocs.site[i]) || (dev.allocs.stack[i] >= 0 && stackHit(dev.allocs.stack[i]));
      },
    };
  }
  // The matching blocks' total at each kept moment.
  function searchTotals() {
    const out = [];
    for (let i = 0; i < dev.frames.length; i++) {
      let total = 0, count = 0;
      for (const s of segmentsOf(i)) {
        const b = s[5];
        for (let k = 0; k < b.length; k += BS) if (search.test(b, k)) { total += b[k + 1]; count++; }
      }
      out.push({ x: dev.frames[i].event, bytes: total, blocks: count });
    }
    return out;
  }
  function drawSearch(canvas, spec) {
    if (!search) { setupCanvas(canvas, 0); canvas._geom = { L: 70, pw: 1, x0: view[0], x1: view[1] }; return; }
    let ymax = 0;
    for (const p of search.totals) if (p.bytes > ymax) ymax = p.bytes;
    const P = plotArea(canvas, spec.height, ymax > 0 ? ymax * 1.05 : 1);
    const { g, L, TOP, pw, ph, X, Y } = P;
    g.save();
    g.beginPath(); g.rect(L, TOP, pw, ph); g.clip();
    g.strokeStyle = '#b7950b'; g.fillStyle = '#b7950b'; g.lineWidth = 1.5;
    g.beginPath();
    search.totals.forEach((p, i) => {
      if (i === 0) g.moveTo(X(p.x), Y(p.bytes)); else { g.lineTo(X(p.x), Y(search.totals[i - 1].bytes)); g.lineTo(X(p.x), Y(p.bytes)); }
    });
    g.stroke();
    for (const p of search.totals) { g.beginPath(); g.arc(X(p.x), Y(p.bytes), 2.5, 0, 7); g.fill(); }
    g.restore();
    marks(P, spec);
  }
  function searchText() {
    const out = document.getElementById('search-result');
    if (!out) return;
    if (!search) { out.textContent = ''; return; }
    const now = search.totals[frameIndex] || { blocks: 0, bytes: 0 };
    out.textContent = `${num(now.blocks)} block${now.blocks === 1 ? '' : 's'} match "${search.q}" in this map (${bytes(now.bytes)}); ` +
      `the chart gives their total at each of the ${num(search.totals.length)} kept moments.`;
  }
  function runSearch(text) {
    search = parseSearch(text);
    const out = document.getElementById('search-result');
    if (search) search.totals = searchTotals();
    searchText();
    document.getElementById('chart-search').style.display = search ? 'block' : 'none';
    drawCharts();
    drawMap();
    return search ? { query: search.q, blocks: (search.totals[frameIndex] || {}).blocks || 0, bytes: (search.totals[frameIndex] || {}).bytes || 0, totals: search.totals } : null;
  }
  api.search = runSearch;
  // For the browser test: an allocation of the device shown, and the call-site timeline.
  api.allocation = (i) => allocation(i);
  api.siteTimeline = () => ({ names: siteLayers().map((l) => l.name), layers: siteLayers().map((l) => l.values), allocated: dev.series.allocated });

  function attachChart(canvas) {
    let down = null;
    const xOf = (ev) => ev.clientX - canvas.getBoundingClientRect().left;
    const eventAt = (px) => {
      const gm = canvas._geom;
      return Math.round(gm.x0 + ((px - gm.L) / gm.pw) * (gm.x1 - gm.x0));
    };
    canvas.addEventListener('mousedown', (ev) => { down = xOf(ev); });
    canvas.addEventListener('mousemove', (ev) => {
      if (down === null) return;
      drawCharts({ canvas, range: [down, xOf(ev)] });
    });
    canvas.addEventListener('mouseup', (ev) => {
      const up = xOf(ev);
      if (down !== null && Math.abs(up - down) > 5) {
        const a = eventAt(Math.min(up, down)), b = eventAt(Math.max(up, down));
        view = [Math.max(0, a), Math.max(a + 1, b)];
        drawCharts();
      } else if (down !== null) {
        selectMoment(Math.max(0, eventAt(up)));
      }
      down = null;
    });
    canvas.addEventListener('mouseleave', () => { if (down !== null) { down = null; drawCharts(); } });
    canvas.addEventListener('dblclick', () => { resetView(); drawCharts(); });
  }

  function resetView() {
    // From the device's first event to its last (event indices count every device's events).
    const xs = dev.series.end_event, x0 = xs.length ? dev.series.first_event[0] : 0;
    view = [x0, Math.max(x0 + 1, xs.length ? xs[xs.length - 1] : D.total_events)];
  }

  // ---- memory map ----
  let mapRows = [];
  function frameFor(event) {
    // The last kept frame at or before `event` (the first frame if none).
    let best = 0;
    for (let i = 0; i < dev.frames.length; i++) if (dev.frames[i].event <= event) best = i;
    return best;
  }

  function selectMoment(event) {
    moment = event;
    if (dev.frames.length) frameIndex = frameFor(event);
    drawCharts();
    drawMap();
    sitesAt();
  }
  // Under the call-site chart: each site's bytes at the sample of the chosen moment (a click
  // on any timeline chooses it).
  function sitesAt() {
    const box = document.getElementById('sites-at');
    if (!box || moment === null) return;
    const s = dev.series, n = s.end_event.length;
    if (!n) return;
    const i = Math.min(n - 1, lowerBound(s.end_event, moment));
    const parts = siteLayers().map((l) => [l.name, l.values[i]]).filter((x) => x[1] > 0);
    box.textContent = `At the end of the sample of event ${num(moment)} (events ${num(s.first_event[i])}–${num(s.end_event[i] - 1)}` +
      `${s.step_first[i] >= 0 ? ', ' + stepText(s.step_first[i]) : ''}${timeText(s.time_us[i])}): ` +
      (parts.length ? parts.map(([name, v]) => `${name} ${bytes(v)}`).join(' · ') : 'nothing allocated');
  }
  api.selectMoment = (event) => { selectMoment(event); return frameIndex; };
  // The x axis: its labelling and the ticks of the charts' current view.
  api.xAxis = () => ({ axis: xAxis, title: axisTitle(), choices: xAxisChoices().map((c) => c[0]), ticks: xTicks(view[0], view[1]) });
  api.selectFrame = (i) => { frameIndex = i; moment = dev.frames[i].event; drawCharts(); drawMap(); return i; };

  function drawMap() {
    const canvas = document.getElementById('map');
    const title = document.getElementById('map-title');
    if (!dev.frames.length) {
      title.textContent = 'No memory map: the input has no segments (a request trace, or no allocator events).';
      setupCanvas(canvas, 10);
      return;
    }
    const t = performance.now();
    const f = dev.frames[frameIndex];
    const segs = segmentsOf(frameIndex);
    const why = f.why === 'before_oom' ? ' — just before the OOM' : f.why === 'end' ? ' — end of the run' :
      f.why === 'peak' ? ' — allocated memory within 1% of its peak' : '';
    let held = 0, used = 0, stranded = 0;
    for (const s of segs) {
      held += s[1];
      const b = s[5];
      for (let k = 0; k < b.length; k += BS) {
        if (b[k + 3] === 1 || b[k + 3] === 2) used += b[k + 1];
        else if (b[k + 3] === 3) stranded += b[k + 1];
      }
    }
    title.textContent = `Memory at event ${num(f.event)} (${stepText(f.step)}${timeText(f.time_us)})${why}: ${num(segs.length)} segments, ` +
      `${bytes(held)} reserved, ${bytes(used)} in blocks in use, ${bytes(stranded)} stranded` +
      (moment !== null && moment !== f.event ? ` (nearest kept moment at or before event ${num(moment)})` : '');
    const maxRows = 400;
    const rows = segs.slice(0, maxRows);
    const rowH = Math.max(4, Math.min(18, Math.floor(560 / Math.max(1, rows.length))));
    const LBL = 92;
    const { g, w } = setupCanvas(canvas, Math.max(40, rows.length * rowH + 4));
    const shared = document.getElementById('map-scale').value === 'shared';
    let maxSize = 1;
    for (const s of rows) if (s[1] > maxSize) maxSize = s[1];
    g.clearRect(0, 0, w, canvas.height);
    g.font = Math.min(11, rowH) + 'px system-ui, sans-serif';
    mapRows = [];
    const pw = w - LBL - 4;
    rows.forEach((s, r) => {
      const y = r * rowH + 2, hgt = Math.max(2, rowH - 1);
      const scale = (shared ? pw / maxSize : pw / s[1]);
      const b = s[5];
      g.fillStyle = '#5b6475'; g.textAlign = 'right';
      if (rowH >= 9) g.fillText(bytes(s[1]) + (s[3] === 0 ? ' s' : ''), LBL - 6, y + hgt - 2);
      for (let k = 0; k < b.length; k += BS) {
        const x = LBL + b[k] * scale, bw = Math.max(1, b[k + 1] * scale);
        const hit = search !== null && search.test(b, k);
        g.fillStyle = hit ? HIGHLIGHT : STATE_COLOR[b[k + 3]];
        g.fillRect(x, y, bw, hgt);
        if (bw > 4) { g.fillStyle = '#ffffff'; g.fillRect(x + bw - 1, y, 1, hgt); }
        if (picked && picked.addr === s[0] + b[k] && bw > 2) {
          g.strokeStyle = '#1d2330'; g.lineWidth = 2; g.strokeRect(x + 1, y + 1, bw - 2, hgt - 2);
        }
      }
      mapRows.push({ y, hgt, s, scale });
    });
    document.getElementById('map-more').textContent = segs.length > maxRows ?
      `Showing the first ${maxRows} of ${num(segs.length)} segments (by address).` : '';
    const slider = document.getElementById('frame-slider');
    slider.max = String(dev.frames.length - 1);
    slider.value = String(frameIndex);
    searchText();
    api.timings.lastMapMs = performance.now() - t;
    api.frameIndex = frameIndex;
  }

  // The block under a mouse event on the map: { s: segment, k: offset in its blocks }.
  function hitBlock(ev) {
    const rect = document.getElementById('map').getBoundingClientRect();
    const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    const row = mapRows.find((r) => y >= r.y && y < r.y + r.hgt + 1);
    if (!row) return null;
    const s = row.s, b = s[5], off = (x - 92) / row.scale;
    for (let k = 0; k < b.length; k += BS) if (off >= b[k] && off < b[k] + b[k + 1]) return { s, k };
    return null;
  }
  // Where block `k` of segment `s` is drawn, in page coordinates (its middle), or null.
  api.blockPoint = (pred) => {
    const rect = document.getElementById('map').getBoundingClientRect();
    for (const r of mapRows) {
      const b = r.s[5];
      for (let k = 0; k < b.length; k += BS) {
        if (!pred(b.slice(k, k + BS), r.s)) continue;
        const x = 92 + b[k] * r.scale, bw = Math.max(1, b[k + 1] * r.scale);
        if (bw < 3) continue;
        return { x: rect.left + x + bw / 2, y: rect.top + r.y + r.hgt / 2, addr: r.s[0] + b[k] };
      }
    }
    return null;
  };

  function mapHover(ev) {
    const tip = document.getElementById('tip');
    const found = hitBlock(ev);
    if (!found) { tip.style.display = 'none'; return; }
    const s = found.s, b = s[5], hit = found.k;
    const st = b[hit + 3], a = allocation(b[hit + 4]), site = a && a[7] >= 0 ? siteName(a[7]) : null;
    tip.textContent = `${STATE[st]} block\naddress ${hex(s[0] + b[hit])}\nsize ${bytes(b[hit + 1])} (${num(b[hit + 1])} B)` +
      (st === 1 || st === 2 ? `\nrequested ${bytes(b[hit + 2])}` : '') +
      `\nsegment ${hex(s[0])}, ${bytes(s[1])}, ${s[3] === 0 ? 'small' : 'large'} pool${s[4] ? ', expandable' : ''}\nstream ${s[2]}` +
      (site ? `\ncall site ${site}` : '');
    tip.style.display = 'block';
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 300) + 'px';
    tip.style.top = ev.clientY + 14 + 'px';
  }

  // ---- the block panel: a click on a block of the map ----
  // Allocation `i` of the device shown (a block's fifth number) from the columns of allocs:
  // [alloc event, step, time, free event, step, time, stream, call site, stack]; null for -1.
  function allocation(i) {
    const A = dev.allocs;
    if (i === undefined || i < 0 || !A) return null;
    return [A.alloc_event[i], A.alloc_step ? A.alloc_step[i] : -1, A.alloc_time[i], A.free_event[i],
      A.free_step ? A.free_step[i] : -1, A.free_time[i], A.stream[i], A.site[i], A.stack[i]];
  }
  let picked = null;  // { addr } of the block shown in the panel
  // `after` is microseconds after the input's first timed event (allocs[] write it so).
  function whenText(event, step, after) {
    return `event ${num(event)}` + (step >= 0 ? `, ${stepText(step)}` : '') + (after >= 0 ? timeText(D.first_time_us + after) : '');
  }
  function frameItem(f, i) {
    const fr = D.stack_frames[f];
    return el('li', {}, el('span', { class: 'fi' }, '#' + i + ' '), el('code', {}, fr[0] || '??'),
      fr[1] ? el('span', { class: 'ff' }, ' ' + fr[1] + (fr[2] ? ':' + fr[2] : '')) : null);
  }
  // The stack, innermost first; each run of machinery frames (unwinder, allocator, dispatcher,
  // interpreter: sources/call_site.h) folded into one line that opens.
  function stackList(id) {
    const ids = D.stacks[id], ul = el('ul', { class: 'stack' });
    for (let i = 0; i < ids.length;) {
      if (!D.stack_frames[ids[i]][3]) { ul.append(frameItem(ids[i], i)); i++; continue; }
      let j = i;
      while (j < ids.length && D.stack_frames[ids[j]][3]) j++;
      const inner = el('ul', { class: 'stack' });
      for (let t = i; t < j; t++) inner.append(frameItem(ids[t], t));
      ul.append(el('li', { class: 'fold' }, el('details', {}, el('summary', {}, `${j - i} frame${j - i === 1 ? '' : 's'} of the unwinder, allocator, dispatcher or interpreter (folded)`), inner)));
      i = j;
    }
    return ul;
  }
  function showBlock(s, k) {
    const box = document.getElementById('block-panel'), b = s[5], st = b[k + 3];
    const a = allocation(b[k + 4]);
    picked = { addr: s[0] + b[k] };
    box.textContent = '';
    box.append(el('h3', {}, `${STATE[st]} block at ${hex(s[0] + b[k])}`));
    const rows = [['size', `${bytes(b[k + 1])} (${num(b[k + 1])} B)`]];
    if (st === 1 || st === 2) rows.push(['requested size', `${bytes(b[k + 2])} (${num(b[k + 2])} B)`]);
    if (a) {
      rows.push(['allocated', a[0] >= 0 ? whenText(a[0], a[1], a[2]) : 'before the recorded history began (live at its start)']);
      rows.push(['freed', a[3] >= 0 ? whenText(a[3], a[4], a[5]) : 'not freed by the end of the input']);
    }
    rows.push(['stream', String(a ? a[6] : s[2])]);
    rows.push(['segment', `${hex(s[0])}, ${bytes(s[1])}, ${s[3] === 0 ? 'small' : 'large'} pool${s[4] ? ', expandable' : ''}`]);
    const site = a ? a[7] : -1;
    if (st === 1 || st === 2) rows.push(['call site', site >= 0 ? siteName(site) : 'none recorded']);
    box.append(el('table', { class: 'kv' }, ...rows.map(([l, v]) => el('tr', {}, el('th', {}, l), el('td', {}, v)))));
    if (a && a[8] >= 0) {
      box.append(el('div', { class: 'hint' }, `Stack (innermost first, ${num(D.stacks[a[8]].length)} frames):`), stackList(a[8]));
    } else if (st === 1 || st === 2) {
      box.append(el('div', { class: 'hint' }, 'No stack recorded for this allocation (a trace names its call site only; a snapshot records stacks when its history was taken with them).'));
    } else {
      box.append(el('div', { class: 'hint' }, 'A free block holds no allocation.'));
    }
    drawMap();
    return box.textContent;
  }
  function mapClick(ev) {
    const found = hitBlock(ev);
    if (found) showBlock(found.s, found.k);
  }

  // ---- OOM panel ----
  function oomPanel(box) {
    if (!dev.ooms.length) {
      box.append(el('p', {}, dev.num_ooms ? `${num(dev.num_ooms)} out-of-memory events, without a diagnosis.` :
        'No out-of-memory event on this device.'));
      return;
    }
    const o = dev.ooms[0];
    box.append(el('p', {}, `First OOM at event ${num(o.event)} (${stepText(o.step)}): asked for ${bytes(o.requested)} ` +
      `(a ${bytes(o.rounded)} block; ${bytes(o.needed)} with a new segment) in the ${o.pool} pool. Reserved ${bytes(o.reserved)}, ` +
      `allocated ${bytes(o.allocated)}, free in gaps ${bytes(o.free_unusable)}, device free ${bytes(o.device_free)}, ` +
      `largest free block of the pool ${bytes(o.largest_free_block)}. ` +
      (o.cause === 'address_space_limit'
        ? `Verdict: the simulator's limit (the free memory, gaps + device, was enough for the ${bytes(o.rounded)} block, ` +
          'but the simulator\'s modelled address space had no room for the segment: a limit of the model, not of the device).'
        : `Verdict: ${o.cause === 'fragmentation' ? 'fragmentation' : 'real shortage'} ` +
          `(the free memory, gaps + device, ${o.cause === 'fragmentation' ? 'exceeded' : 'fell short of'} the ${bytes(o.rounded)} block by ${bytes(o.margin)}).`)));
    const fi = dev.frames.findIndex((f) => f.why === 'before_oom' && f.event === o.event);
    if (fi >= 0) {
      const free = [];
      for (const s of segmentsOf(fi)) {
        if ((s[3] === 0 ? 'small' : 'large') !== o.pool) continue;
        const b = s[5];
        for (let k = 0; k < b.length; k += BS) if (b[k + 3] === 0 || b[k + 3] === 3) free.push(b[k + 1]);
      }
      free.sort((a, b) => b - a);
      const c = el('canvas', { id: 'oom-chart', class: 'chart' });
      box.append(el('div', { class: 'hint' }, `The request against the ${num(free.length)} free blocks of the ${o.pool} pool (largest first, up to 40):`), c);
      requestAnimationFrame(() => {
        const top = free.slice(0, 40);
        const H = 26 + top.length * 14;
        const { g, w } = setupCanvas(c, H);
        const m = Math.max(o.rounded, top[0] || 1);
        const L = 150, pw = w - L - 20;
        g.font = '11px system-ui, sans-serif';
        g.fillStyle = '#d62728'; g.fillRect(L, 4, (o.rounded / m) * pw, 12);
        g.textAlign = 'right'; g.fillText('request ' + bytes(o.rounded), L - 6, 14);
        top.forEach((v, i) => {
          g.fillStyle = '#cfd4dc'; g.fillRect(L, 24 + i * 14, Math.max(1, (v / m) * pw), 11);
          g.fillStyle = '#5b6475'; g.fillText(bytes(v), L - 6, 33 + i * 14);
        });
        g.strokeStyle = '#d62728'; g.setLineDash([3, 3]);
        g.beginPath(); g.moveTo(L + (o.rounded / m) * pw, 4); g.lineTo(L + (o.rounded / m) * pw, H); g.stroke();
      });
      box.append(el('button', { onclick: () => { api.selectFrame(fi); document.getElementById('map-title').scrollIntoView(); } },
        'Show the map just before this OOM'));
    }
    if (dev.explain) {
      const e = dev.explain;
      box.append(el('h3', {}, 'What to do (fragscope explain)'), el('p', {}, e.summary));
      const t = el('table', {}, el('tr', {}, el('th', {}, '#'), el('th', {}, 'remedy'), el('th', {}, 'setting'), el('th', {}, 'why'), el('th', {}, 'replayed')));
      e.remedies.forEach((r, i) => {
        const chk = r.check ? (r.check.oom ? el('span', { class: 'bad' }, r.check.worse ? `worse than the current settings: OOM earlier, at ${stepText(r.check.oom_step)}` : `still OOM at ${stepText(r.check.oom_step)}`) :
          el('span', { class: 'ok' }, `fits, peak reserved ${bytes(r.check.peak_reserved)}`)) :
          (r.alloc_conf ? 'not replayed' : 'a code change: not replayable');
        t.append(el('tr', {}, el('td', {}, i + 1), el('td', {}, r.action), el('td', {}, r.alloc_conf ? el('code', {}, r.alloc_conf) : ''), el('td', {}, r.why), el('td', {}, chk)));
      });
      box.append(t);
      const checked = e.remedies.filter((r) => r.check);
      if (checked.length && checked.every((r) => r.check.oom) && !D.tune) {
        box.append(el('p', { class: 'hint' }, 'No replayed setting avoids this OOM. `fragscope report … --tune` ' +
          '(or `fragscope tune`) searches 72 allocator settings on the same device.'));
      }
    }
  }

  // ---- page ----
  function keyNumbers(d) {
    const k = d.key, box = el('div', { class: 'keys' });
    const add = (l, v, sub) => box.append(el('div', { class: 'key' }, el('div', { class: 'v' }, v), el('div', { class: 'l' }, l + (sub ? ' · ' + sub : ''))));
    const at = (x) => (x ? 'event ' + num(x.event) + ', ' + stepText(x.step) : '');
    if (D.kind !== 'request') {
      add('peak reserved', bytes(k.peak_reserved && k.peak_reserved.bytes), at(k.peak_reserved));
      add('peak allocated', bytes(k.peak_allocated && k.peak_allocated.bytes), at(k.peak_allocated));
      // Information, not an alarm: a healthy job caches most of what it reserves for reuse.
      add('worst fragmentation ratio', k.worst_fragmentation ? (k.worst_fragmentation_ratio * 100).toFixed(1) + '%' : '–',
        [at(k.worst_fragmentation), k.worst_fragmentation_condition].filter((x) => x).join(', '));
      add('smallest largest free block', bytes(k.min_largest_free_block && k.min_largest_free_block.bytes), 'typical request (p90) ' + bytes(k.request_p90));
      add('smallest max allocatable', bytes(k.min_max_allocatable && k.min_max_allocatable.bytes), at(k.min_max_allocatable));
    }
    add('peak requested', bytes(k.peak_requested && k.peak_requested.bytes), at(k.peak_requested));
    // The device's memory is the figure; its index and name are the label (a big "0" said nothing).
    add('device memory', d.capacity ? bytes(d.capacity) : 'unknown', `device ${d.device}` + (d.name ? ': ' + d.name : ''));
    add('events', num(d.events), num(d.num_ooms) + ' OOM');
    return box;
  }

  function render() {
    app.textContent = '';
    const hasOom = dev.ooms.length > 0 || dev.num_ooms > 0;
    app.append(el('h1', {}, 'fragscope report'), el('div', { class: 'source' }, D.source + ' · ' + D.kind + ' trace · ' + num(D.total_events) + ' events' +
      (D.replay ? ' · replayed on a virtual GPU (' + D.replay.devices.map((x) => bytes(x.capacity) + (x.alloc_conf ? ', ' + x.alloc_conf : '')).join('; ') + ')' : '')));
    if (D.devices.length > 1) {
      const sel = el('select', { id: 'device', onchange: (ev) => { choose(Number(ev.target.value)); } });
      D.devices.forEach((d, i) => { const o = el('option', { value: i }, `device ${d.device}${d.num_ooms ? ' (OOM)' : ''}`); if (d === dev) o.selected = true; sel.append(o); });
      app.append(el('div', { class: 'bar' }, 'Device: ', sel));
    }
    app.append(el('div', { id: 'verdict', class: 'verdict' + (hasOom ? ' oom' : '') }, dev.verdict));
    app.append(keyNumbers(dev));

    app.append(el('h2', {}, 'Timeline'));
    const legend = el('div', { class: 'legend' });
    for (const s of BYTE_SERIES) {
      const sp = el('span', { class: hidden[s.key] ? 'off' : '', onclick: () => { hidden[s.key] = !hidden[s.key]; sp.classList.toggle('off'); drawCharts(); } },
        el('i', { style: 'background:' + COLORS[s.key] }), s.label);
      legend.append(sp);
    }
    app.append(legend);
    const c1 = el('canvas', { id: 'chart-bytes', class: 'chart' });
    const c2 = el('canvas', { id: 'chart-frag', class: 'chart' });
    app.append(c1, el('div', { class: 'legend' }, el('span', {}, el('i', { style: 'background:' + COLORS.fragmentation }), 'fragmentation ratio (cached free / reserved)'),
      dev.forecast ? el('span', {}, 'OOM risk band: ', ...['ok', 'watch', 'warning', 'critical'].map((l) => el('span', {}, el('i', { style: 'background:' + RISK_COLOR[l] }), l))) : null), c2);
    const axis = el('select', { id: 'x-axis', onchange: (ev) => { xAxis = ev.target.value; xAxisPicked = true; drawCharts(); } });
    for (const [id, label] of xAxisChoices()) {
      const o = el('option', { value: id }, label);
      if (id === xAxis) o.selected = true;
      axis.append(o);
    }
    app.append(el('div', { class: 'bar' }, 'x axis: ', axis));
    app.append(el('div', { class: 'hint' }, `Samples: ${D.timeline_unit === 'step' ? (D.steps_per_sample > 1 ? 'one per ' + num(D.steps_per_sample) + ' steps' : 'one per step') : 'one per ' + num(D.every_events) + ' events'} ` +
      '(each pixel column keeps its minimum and maximum; faint lines: the peaks inside each sample). Click to show the memory at that moment; drag to zoom; double-click to zoom out. Red lines: out-of-memory events.'));
    charts = [
      { canvas: c1, spec: { height: 260, bytes: true, series: BYTE_SERIES, cap: dev.capacity && !D.replay?.devices.some((x) => x.capacity >= 2 ** 50) ? dev.capacity : 0 } },
      { canvas: c2, spec: { height: 120, pct: true, ymax: 1, risk: !!dev.forecast, series: [{ key: 'fragmentation' }] } },
    ];
    if (dev.forecast) {
      const f = dev.forecast;
      app.append(el('div', { class: 'hint' }, `Forecast: worst level ${f.worst}` + (f.first_warning_step != null ? `, first warning at ${f.unit} ${f.first_warning_step}` : '') +
        (f.first_critical_step != null ? `, first critical at ${f.unit} ${f.first_critical_step}` : '') + '.'));
      // Where the risk comes from (issue 31 item 5): at the first warning, else at the last sample.
      const warned = f.changes.find((c) => c.step === f.first_warning_step && c.risk);
      const at = warned || (f.last && f.last.risk ? f.last : null);
      if (at) {
        app.append(el('div', { class: 'hint', id: 'risk-from' }, `OOM risk at ${f.unit} ${at.step}: P(OOM within ${at.risk.steps} steps) = ${(100 * at.risk.p).toFixed(1)}%; from: ${at.risk.from}`));
      }
    }
    if (dev.site_timeline && !dev.site_timeline.sites.length) {
      app.append(el('h2', {}, 'Active memory by call site'),
        el('p', { class: 'hint', id: 'sites-none' }, 'No block of this device names a call site (a replay\'s simulated events carry none; a snapshot without recorded stacks neither).'));
    } else if (dev.site_timeline && dev.series.end_event.length) {
      app.append(el('h2', {}, 'Active memory by call site'));
      const layers = siteLayers();
      app.append(el('div', { class: 'legend', id: 'sites-legend' }, ...layers.map((l) => el('span', {}, el('i', { style: 'background:' + l.color }), l.name))));
      const c3 = el('canvas', { id: 'chart-sites', class: 'chart' });
      app.append(c3, el('div', { class: 'hint' }, `The allocated bytes (as the timeline's allocated line: a block pending free no longer counts) by the call site that allocated them, at the end of each sample, from every event; ` +
        `the ${num(dev.site_timeline.sites.length)} sites with the highest peak, and the rest together. Click a point for each site's bytes there.`),
        el('div', { id: 'sites-at', class: 'hint' }));
      charts.push({ canvas: c3, spec: { kind: 'sites', height: 220 } });
    }
    charts.forEach((c) => attachChart(c.canvas));

    app.append(el('h2', {}, 'Memory map'));
    const scale = el('select', { id: 'map-scale', onchange: drawMap }, el('option', { value: 'segment' }, 'each segment fills the width'), el('option', { value: 'shared' }, 'one scale for all segments'));
    const slider = el('input', { id: 'frame-slider', type: 'range', min: '0', max: '0', value: '0', style: 'flex:1', oninput: (ev) => api.selectFrame(Number(ev.target.value)) });
    app.append(el('div', { id: 'map-title' }), el('div', { class: 'bar' }, 'Kept moments: ', slider, scale));
    app.append(el('div', { class: 'legend' }, ...STATE.map((s, i) => el('span', {}, el('i', { style: 'background:' + STATE_COLOR[i] }), s))));
    app.append(el('div', { class: 'bar' }, 'Search blocks: ', el('input', { id: 'search', type: 'search', size: '36',
      placeholder: 'function, file or size: attention, model.py, >=64MiB', onchange: (ev) => runSearch(ev.target.value) }),
    el('span', { id: 'search-result', class: 'hint' })));
    const searchChart = el('canvas', { id: 'chart-search', class: 'chart', style: 'display:none' });
    app.append(searchChart);
    charts.push({ canvas: searchChart, spec: { kind: 'search', height: 150 } });
    attachChart(searchChart);
    const map = el('canvas', { id: 'map' });
    map.addEventListener('click', mapClick);
    map.addEventListener('mousemove', mapHover);
    map.addEventListener('mouseleave', () => { document.getElementById('tip').style.display = 'none'; });
    app.append(el('div', { id: 'map-wrap' }, map), el('div', { id: 'map-more', class: 'hint' }),
      el('div', { class: 'hint' }, `One row per segment, by address; ${num(dev.frames.length)} moments kept (periodic, just before each OOM, the peak of allocated memory, and the end). Hover a block for its details; click it for its stack and history.`),
      el('div', { id: 'block-panel', class: 'panel' }, el('span', { class: 'hint' }, 'Click a block of the map: its stack, sizes, when it was allocated and freed, its stream.')));

    app.append(el('h2', {}, 'Out of memory'));
    const box = el('div', { id: 'oom' });
    app.append(box);
    oomPanel(box);

    if (dev.stranding_sites.length) {
      app.append(el('h2', {}, `Call sites that strand the most memory (at the ${dev.stranding_sites_at})`));
      const t = el('table', {}, el('tr', {}, el('th', {}, 'call site'), el('th', { class: 'n' }, 'stranded'), el('th', { class: 'n' }, 'live'), el('th', { class: 'n' }, 'blocks'), el('th', { class: 'n' }, 'segments')));
      for (const s of dev.stranding_sites) t.append(el('tr', {}, el('td', {}, s.site || '(no call site recorded)'), el('td', { class: 'n' }, bytes(s.stranded)), el('td', { class: 'n' }, bytes(s.live)), el('td', { class: 'n' }, num(s.blocks)), el('td', { class: 'n' }, num(s.segments))));
      app.append(t);
    }
    if (D.tune) {
      app.append(el('h2', {}, 'Allocator settings, ranked (tune)'));
      // The history may be unable to tell the settings apart: no recommendation then.
      if (D.tune_cannot_rank) app.append(el('p', { class: 'hint' }, 'No recommendation: ' + D.tune_cannot_rank + '.'));
      const t = el('table', {}, el('tr', {}, el('th', {}, '#'), el('th', {}, 'PYTORCH_CUDA_ALLOC_CONF'), el('th', {}, 'outcome'), el('th', { class: 'n' }, 'peak reserved'), el('th', { class: 'n' }, 'waste at peak')));
      D.tune.forEach((r, i) => t.append(el('tr', {}, el('td', {}, i + 1), el('td', {}, el('code', {}, r.conf || '(defaults)')), el('td', {}, r.oom ? el('span', { class: 'bad' }, 'OOM at ' + stepText(r.oom_step)) : el('span', { class: 'ok' }, 'fits')),
        el('td', { class: 'n' }, bytes(r.peak_reserved)), el('td', { class: 'n' }, (r.waste_at_peak * 100).toFixed(1) + '%'))));
      app.append(t);
    }
    if (D.compare) app.append(...compareSection());
    const notes = [...D.notes, ...(D.replay ? D.replay.notes : []), ...(dev.forecast ? dev.forecast.notes : [])];
    if (notes.length) {
      app.append(el('h2', {}, 'Notes'));
      app.append(el('ul', { class: 'notes' }, ...notes.map((n) => el('li', {}, n))));
    }
    app.append(el('p', { class: 'hint' }, 'Made by ' + D.command + '. Metrics: docs/metrics.md; this page: docs/report.md.'));
  }

  // `report A --compare B` (issue 33 item 2): the two runs side by side, from diff's JSON
  // (docs/json-schema.md, "fragscope diff"): the pair of the device shown, else every pair.
  const COMPARE_ROWS = [['peak_reserved_bytes', 'peak reserved', 'bytes'], ['peak_allocated_bytes', 'peak allocated', 'bytes'],
    ['peak_requested_bytes', 'peak requested', 'bytes'], ['worst_fragmentation_ratio', 'worst fragmentation ratio', 'ratio'],
    ['stranded_bytes_at_end', 'stranded at the end', 'bytes'], ['ooms', 'OOMs', 'count']];
  function compareValue(kind, v) {
    if (v == null) return '-';
    return kind === 'bytes' ? bytes(v) : kind === 'ratio' ? (100 * v).toFixed(1) + '%' : num(v);
  }
  function compareChange(kind, c, a) {
    if (c == null) return '-';
    if (c === 0) return 'same';
    const sign = c > 0 ? '+' : '-';
    if (kind === 'ratio') return sign + Math.abs(100 * c).toFixed(Math.abs(100 * c) < 0.05 ? 2 : 1) + ' points';
    if (kind === 'count') return sign + num(Math.abs(c));
    return sign + bytes(Math.abs(c)) + (a ? ` (${sign}${Math.abs(100 * c / a).toFixed(1)}%)` : '');
  }
  function compareOom(o) {
    if (!o) return 'none';
    return `${o.step != null ? stepText(o.step) + ', ' : ''}${o.index_of === 'request' ? 'request event' : 'event'} ${num(o.event_index)}: ${bytes(o.requested_bytes)} ` +
      `(rounded ${bytes(o.rounded_bytes)}, ${o.pool} pool); ${o.cause}` + (o.site ? '; call site: ' + o.site : '');
  }
  function compareSection() {
    const C = D.compare;
    const out = [el('h2', {}, 'Compared with ' + C.b.path),
      el('p', { class: 'hint' }, `A: ${C.a.path} (${C.a.kind}, ${C.a.how}). B: ${C.b.path} (${C.b.kind}, ${C.b.how}). ` +
        'Figures as `fragscope diff` gives them (docs/metrics.md, "Comparing runs").')];
    const shown = C.devices.filter((p) => p.a && p.a.device === dev.device);
    for (const p of shown.length ? shown : C.devices) {
      const title = `${p.a ? 'device ' + p.a.device : 'no device'} of A against ${p.b ? 'device ' + p.b.device : 'no device'} of B`;
      out.push(el('p', { class: 'compare-headline' }, el('b', {}, title + ': '), p.headline));
      const t = el('table', { class: 'compare' }, el('tr', {}, el('th', {}, ''), el('th', { class: 'n' }, 'A'), el('th', { class: 'n' }, 'B'), el('th', { class: 'n' }, 'change')));
      for (const [key, label, kind] of COMPARE_ROWS) {
        const c = p.changes[key];
        t.append(el('tr', {}, el('td', {}, label), el('td', { class: 'n' }, compareValue(kind, c.a)), el('td', { class: 'n' }, compareValue(kind, c.b)),
          el('td', { class: 'n' }, compareChange(kind, c.change, c.a))));
      }
      out.push(t);
      if (p.a) out.push(el('p', {}, 'First OOM of A: ' + compareOom(p.a.first_oom)));
      if (p.b) out.push(el('p', {}, 'First OOM of B: ' + compareOom(p.b.first_oom)));
      for (const [side, d] of [['A', p.a], ['B', p.b]]) {
        if (d && d.first_oom && d.first_oom.index_of === 'request') out.push(el('p', { class: 'hint' }, `${side}'s replay stops at its first OOM: its figures are of the run up to it.`));
      }
      if (!p.site_changes.length) {
        out.push(el('p', { class: 'hint' }, "No call site's peak memory changed."));
        continue;
      }
      out.push(el('h3', {}, `Call sites whose memory changed most (peak live requested bytes; ${num(p.site_changes.length)} of ${num(p.sites_changed)} changed)`));
      const s = el('table', { class: 'compare-sites' }, el('tr', {}, el('th', { class: 'n' }, 'A'), el('th', { class: 'n' }, 'B'), el('th', { class: 'n' }, 'change'), el('th', {}, 'call site')));
      for (const c of p.site_changes) {
        const only = c.a_peak_live_bytes == null ? ' (only in B)' : c.b_peak_live_bytes == null ? ' (only in A)' : '';
        s.append(el('tr', {}, el('td', { class: 'n' }, bytes(c.a_peak_live_bytes || 0)), el('td', { class: 'n' }, bytes(c.b_peak_live_bytes || 0)),
          el('td', { class: 'n' }, compareChange('bytes', c.change_bytes, 0)), el('td', {}, c.site + only)));
      }
      out.push(s);
    }
    return out;
  }

  function choose(i) {
    dev = D.devices[i];
    search = null;
    picked = null;
    if (dev.times === undefined) dev.times = timePoints(dev);
    if (!xAxisPicked || !xAxisChoices().some((c) => c[0] === xAxis)) xAxis = defaultXAxis();
    resolved = [];
    resetView();
    render();
    // The map opens just before the first OOM, else at the peak of allocated memory.
    const firstOom = dev.frames.findIndex((f) => f.why === 'before_oom');
    const peakFrame = dev.frames.findIndex((f) => f.why === 'peak');
    frameIndex = firstOom >= 0 ? firstOom : peakFrame >= 0 ? peakFrame : dev.frames.length - 1;
    moment = dev.frames.length ? dev.frames[frameIndex].event : null;
    drawCharts();
    api.timings.firstChartMs = performance.now();
    drawMap();
    api.device = dev.device;
  }

  try {
    document.body.append(el('div', { id: 'tip' }));
    if (!D.devices.length) {
      app.append(el('h1', {}, 'fragscope report'), el('div', { id: 'verdict', class: 'verdict' }, D.verdict));
    } else {
      let start = D.devices.findIndex((d) => d.num_ooms > 0);
      choose(start >= 0 ? start : 0);
    }
    window.addEventListener('resize', () => { if (dev) { drawCharts(); drawMap(); } });
    api.timings.scriptMs = performance.now() - T0;
    api.ready = true;
  } catch (e) {
    api.errors.push(String(e && e.stack || e));
    throw e;
  }
})();
