// fleetpulse fleet heatmap: one canvas cell per GPU, laid out row -> rack -> node -> GPU.
//
// Everything comes from the Prometheus-compatible query API next to this page
// (api/v1/query_range, api/v1/label/__name__/values) plus small JSON endpoints of the
// web module: web/config.json (what to query), web/alerts (recent alerts, the clock) and
// web/health (the worst GPUs of the last days, for the "health (7 days)" colour mode).
// The page fetches the last hour of one metric for every GPU once, keeps it as one
// Float32Array per time step, and scrubs through it locally, so replaying a thermal wave
// costs no request. Plain JavaScript, no libraries, no build step: the file is served as is.
"use strict";
(() => {
  const LEVELS = ["cluster", "row", "rack", "node", "gpu"];
  const $ = (id) => document.getElementById(id);
  const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e",
    "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
  const SEVERITY_RANK = { critical: 3, warning: 2, info: 1 };
  const SEVERITY_COLOR = { 3: "#ff4d4f", 2: "#ffa940", 1: "#fadb14" };
  const MISSING = "#2b2f36";
  const HEALTH_OK = "#1d5c3a";
  // "health (7 days)": green (nothing in the window) -> yellow (one incident) -> orange (two)
  // -> red (HEALTH_TOP incidents or more), the severity colours of the alert mode.
  const HEALTH_RAMP = [HEALTH_OK, SEVERITY_COLOR[1], SEVERITY_COLOR[2], SEVERITY_COLOR[3]];
  const HEALTH_TOP = 3;
  const HEALTH_WINDOW = "7d";     // the web/health window, and how the page names it:
  const HEALTH_SPAN = "7 days";
  const LINE_COLORS = ["#5fb3ff", "#ffa940", "#52c41a", "#f759ab", "#b37feb", "#fadb14",
    "#13c2c2", "#ff7a45"];

  const S = {
    cfg: null,
    metrics: [],
    mode: "",            // "metric:<name>", "health:alerts", "health:score" or "health:rank"
    metric: "",          // the metric behind the frames and the charts
    gpus: [],            // {cluster,row,rack,node,gpu,path,key}, sorted row/rack/node/gpu
    byKey: new Map(),    // label key -> index
    byPath: new Map(),   // entity path -> index
    step: 30,
    times: [],           // frame times in seconds
    frames: [],          // Float32Array(G) per frame, NaN = no data
    frame: -1,
    live: true,
    playing: 0,
    domain: [0, 1],
    view: [],            // drill-down path components: [cluster, row?, rack?, node?]
    selected: -1,        // GPU index when the view is a single GPU
    alerts: [],
    scores: {},
    health: new Map(),   // GPU entity path -> its web/health row (GPUs absent: healthy)
    nowMs: Date.now(),
    layout: null,
    charts: [],
    chartSeq: 0,
    loading: false,
  };

  // ---------------------------------------------------------------- data access
  async function getJSON(url, params) {
    const qs = params ? "?" + new URLSearchParams(params).toString() : "";
    const resp = await fetch(url + qs, { headers: { Accept: "application/json" } });
    let body;
    try {
      body = await resp.json();
    } catch (err) {
      throw new Error(`${url}: HTTP ${resp.status}, not JSON`);
    }
    if (!resp.ok || (body.status && body.status !== "success")) {
      throw new Error(`${url}: ${body.error || resp.statusText}`);
    }
    return body;
  }

  async function prom(path, params) {
    return (await getJSON(S.cfg.api_base + path, params)).data;
  }

  function quote(v) {
    return '"' + String(v).replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"';
  }

  function selector(metric, level, labels) {
    const parts = [`level=${quote(level)}`];
    const extra = (S.cfg.level_matchers || {})[level];
    if (extra) parts.push(extra);
    for (const [k, v] of Object.entries(labels || {})) parts.push(`${k}=${quote(v)}`);
    return `${metric}{${parts.join(",")}}`;
  }

  function gpuPath(l) {
    return S.cfg.gpu_entity
      .replace("{cluster}", l.cluster).replace("{row}", l.row).replace("{rack}", l.rack)
      .replace("{node}", l.node).replace("{gpu}", l.gpu);
  }

  function gpuOrder(a, b) {
    for (const k of ["cluster", "row", "rack", "node"]) {
      if (a[k] !== b[k]) return a[k] < b[k] ? -1 : 1;
    }
    const ga = Number(a.gpu), gb = Number(b.gpu);
    if (!Number.isNaN(ga) && !Number.isNaN(gb) && ga !== gb) return ga - gb;
    return a.gpu < b.gpu ? -1 : a.gpu > b.gpu ? 1 : 0;
  }

  // Registers every GPU seen in a result; returns true when the fleet changed shape.
  function learnGpus(result) {
    let added = false;
    for (const s of result) {
      const m = s.metric;
      if (!m.row || !m.rack || !m.node || m.gpu === undefined) continue;
      const key = `${m.cluster}/${m.row}/${m.rack}/${m.node}/${m.gpu}`;
      if (S.byKey.has(key)) continue;
      const g = { cluster: m.cluster || "", row: m.row, rack: m.rack, node: m.node, gpu: m.gpu, key };
      g.path = gpuPath(g);
      S.gpus.push(g);
      S.byKey.set(key, -1);
      added = true;
    }
    if (!added) return false;
    const old = S.gpus.map((g) => g.key);
    S.gpus.sort(gpuOrder);
    const remap = new Int32Array(old.length);
    S.byKey.clear();
    S.byPath.clear();
    S.gpus.forEach((g, i) => { S.byKey.set(g.key, i); S.byPath.set(g.path, i); });
    old.forEach((key, oldIndex) => { remap[oldIndex] = S.byKey.get(key); });
    // Re-seat the frames in the new order; cells of new GPUs start as "no data".
    const G = S.gpus.length;
    S.frames = S.frames.map((f) => {
      const nf = new Float32Array(G).fill(NaN);
      for (let j = 0; j < f.length; j++) nf[remap[j]] = f[j];
      return nf;
    });
    if (S.selected >= 0) S.selected = remap[S.selected];
    return true;
  }

  function chooseStep(rangeS, gpus) {
    const minStep = S.cfg.min_step_s;
    const byBudget = Math.ceil((rangeS * Math.max(gpus, 1)) / S.cfg.max_points);
    const nice = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
    const want = Math.max(minStep, byBudget);
    return nice.find((n) => n >= want) || want;
  }

  // Writes a matrix result into frames[k] for k = round((t - t0) / step).
  function ingest(result, t0, n) {
    for (const s of result) {
      const m = s.metric;
      const i = S.byKey.get(`${m.cluster}/${m.row}/${m.rack}/${m.node}/${m.gpu}`);
      if (i === undefined) continue;
      for (const [t, v] of s.values) {
        const k = Math.round((t - t0) / S.step);
        if (k >= 0 && k < n) S.frames[S.frames.length - n + k][i] = parseFloat(v);
      }
    }
  }

  async function loadRange() {
    S.loading = true;
    setStatus("loading the last hour…");
    const rangeS = S.cfg.range_s;
    if (!S.gpus.length) {
      // Learn the fleet's size from one instant vector first, so the range fetch can pick
      // a step that keeps GPUs x steps within the point budget.
      try {
        const inst = await prom("api/v1/query", { query: selector(S.metric, "gpu"), time: S.nowMs / 1000 });
        learnGpus(inst.result);
      } catch (err) {
        // the range query below still works, at the smallest step
      }
    }
    S.step = chooseStep(rangeS, Math.max(S.gpus.length, S.cfg.expected_gpus || 0));
    const end = Math.floor(S.nowMs / 1000 / S.step) * S.step;
    const start = end - rangeS + S.step;
    const t = performance.now();
    const data = await prom("api/v1/query_range", {
      query: selector(S.metric, "gpu"), start, end, step: S.step,
    });
    const n = Math.round((end - start) / S.step) + 1;
    S.frames = [];
    learnGpus(data.result);
    const G = S.gpus.length;
    S.times = [];
    for (let k = 0; k < n; k++) {
      S.times.push(start + k * S.step);
      S.frames.push(new Float32Array(G).fill(NaN));
    }
    ingest(data.result, start, n);
    trimEmptyTail();
    trimEmptyHead();
    S.domain = robustDomain();
    if (S.live || S.frame < 0) S.frame = S.frames.length - 1;
    S.frame = Math.min(S.frame, S.frames.length - 1);
    S.loading = false;
    setStatus(`${G.toLocaleString()} GPUs · ${S.frames.length} steps of ${S.step} s · ` +
      `fetched in ${Math.round(performance.now() - t)} ms`);
  }

  // Drops trailing frames with no data at all (the newest step may not be rolled up yet).
  function trimEmptyTail() {
    while (S.frames.length > 1 && !S.frames[S.frames.length - 1].some((v) => !Number.isNaN(v))) {
      S.frames.pop();
      S.times.pop();
    }
  }

  // Drops leading empty frames too: a fleet younger than the range starts the scrubber at
  // its first data, not at an hour of blank cells.
  function trimEmptyHead() {
    let k = 0;
    while (k < S.frames.length - 1 && !S.frames[k].some((v) => !Number.isNaN(v))) k++;
    if (k) {
      S.frames.splice(0, k);
      S.times.splice(0, k);
    }
  }

  async function extendRange() {
    if (!S.times.length) return loadRange();
    const last = S.times[S.times.length - 1];
    const end = Math.floor(S.nowMs / 1000 / S.step) * S.step;
    if (end <= last) return;
    const start = last + S.step;
    const data = await prom("api/v1/query_range", {
      query: selector(S.metric, "gpu"), start, end, step: S.step,
    });
    learnGpus(data.result);
    const n = Math.round((end - start) / S.step) + 1;
    const G = S.gpus.length;
    for (let k = 0; k < n; k++) {
      S.times.push(start + k * S.step);
      S.frames.push(new Float32Array(G).fill(NaN));
    }
    ingest(data.result, start, n);
    trimEmptyTail();
    const keep = Math.round(S.cfg.range_s / S.step);
    const drop = Math.max(0, S.frames.length - keep);
    if (drop) {
      S.frames.splice(0, drop);
      S.times.splice(0, drop);
      S.frame = Math.max(0, S.frame - drop);
    }
    widenDomain(S.frames[S.frames.length - 1]);
    if (S.live) S.frame = S.frames.length - 1;
  }

  function robustDomain() {
    const sample = [];
    const every = Math.max(1, Math.floor((S.frames.length * S.gpus.length) / 60000));
    let c = 0;
    for (const f of S.frames) {
      for (let i = 0; i < f.length; i++) {
        if (c++ % every === 0 && Number.isFinite(f[i])) sample.push(f[i]);
      }
    }
    if (!sample.length) return [0, 1];
    sample.sort((a, b) => a - b);
    let lo = sample[Math.floor(sample.length * 0.01)];
    let hi = sample[Math.min(sample.length - 1, Math.floor(sample.length * 0.99))];
    if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
    return [lo, hi];
  }

  function widenDomain(frame) {
    if (!frame) return;
    for (const v of frame) {
      if (!Number.isFinite(v)) continue;
      if (v < S.domain[0]) S.domain[0] = v;
      if (v > S.domain[1]) S.domain[1] = v;
    }
  }

  async function refreshAlerts() {
    const body = await getJSON("web/alerts", { limit: S.cfg.alert_limit });
    S.alerts = body.data.alerts;
    S.scores = body.data.scores || {};
    S.nowMs = body.data.now_ms;
  }

  // The ranking covers the whole fleet the page knows (not just the drilled-into part: the
  // server ranks fleet-wide, so a rack's GPUs may sit anywhere in it), up to the route's cap.
  // Only GPUs with something in the window are listed, so the cap is rarely reached; past it
  // the worst max_alerts GPUs are shown and the rest look healthy.
  async function refreshHealth() {
    const limit = Math.min(S.cfg.max_alerts, Math.max(20, S.gpus.length));
    const body = await getJSON("web/health", { window: HEALTH_WINDOW, limit });
    S.health = new Map(body.data.gpus.map((h) => [h.gpu, h]));
  }

  // ---------------------------------------------------------------- alert state
  function activeAt(a, tMs) {
    if (a.started_ms > tMs) return false;
    return a.state === "firing" || a.updated_ms > tMs;
  }

  function frameTimeMs() {
    if (S.live || S.frame < 0 || !S.times.length) return S.nowMs;
    return S.times[S.frame] * 1000;
  }

  // Severity rank per GPU (own alerts) and per group path (node/rack/row alerts) at time t.
  function alertState(tMs) {
    const gpu = new Int8Array(S.gpus.length);
    const groups = new Map();
    const useNow = S.live;
    for (const a of S.alerts) {
      const on = useNow ? a.state === "firing" : activeAt(a, tMs);
      if (!on) continue;
      const rank = SEVERITY_RANK[a.severity] || 1;
      const i = S.byPath.get(a.entity);
      if (i !== undefined) {
        gpu[i] = Math.max(gpu[i], rank);
      } else {
        groups.set(a.entity, Math.max(groups.get(a.entity) || 0, rank));
      }
    }
    return { gpu, groups };
  }

  // ---------------------------------------------------------------- layout
  function viewLevel() {
    if (S.selected >= 0) return "gpu";
    return LEVELS[Math.max(0, S.view.length - 1)];
  }

  function inView(g) {
    const keys = ["cluster", "row", "rack", "node"];
    for (let d = 0; d < S.view.length; d++) if (g[keys[d]] !== S.view[d]) return false;
    return true;
  }

  const CELL_MAX = { cluster: 22, row: 34, rack: 60, node: 96, gpu: 96 };

  function computeLayout(width) {
    const level = viewLevel();
    const idx = [];
    S.gpus.forEach((g, i) => { if (inView(g)) idx.push(i); });
    // Group consecutive (sorted) GPUs into rows -> racks -> nodes.
    const rows = [];
    for (const i of idx) {
      const g = S.gpus[i];
      let row = rows[rows.length - 1];
      if (!row || row.name !== g.row) rows.push(row = { name: g.row, cluster: g.cluster, racks: [] });
      let rack = row.racks[row.racks.length - 1];
      if (!rack || rack.name !== g.rack) row.racks.push(rack = { name: g.rack, nodes: [] });
      let node = rack.nodes[rack.nodes.length - 1];
      if (!node || node.name !== g.node) rack.nodes.push(node = { name: g.node, gpus: [] });
      node.gpus.push(i);
    }
    const maxRacks = Math.max(1, ...rows.map((r) => r.racks.length));
    const maxGpus = Math.max(1, ...rows.flatMap((r) => r.racks.flatMap((k) => k.nodes.map((n) => n.gpus.length))));
    const maxNodes = Math.max(1, ...rows.flatMap((r) => r.racks.map((k) => k.nodes.length)));
    const deep = level === "rack" || level === "node" || level === "gpu";
    const pad = 8;
    const nodeLabelW = deep ? 118 : 0;
    const rowLabelH = 18;
    const rackGap = Math.max(8, Math.round(width / 120));
    const rowGapX = 3 * rackGap;
    const rackLabelFor = (s) => (s >= 6 ? 15 : 0);
    const lineGapFor = (s) => Math.max(6, Math.round(s * 0.5)) + 6;
    // Cell size when `rowsPerLine` rows of `racksPerLine` racks share one line of the canvas.
    const cellFor = (rowsPerLine, racksPerLine) => {
      const fixed = 2 * pad + (rowsPerLine - 1) * rowGapX + rowsPerLine * racksPerLine * (nodeLabelW + rackGap);
      const s = Math.floor((width - fixed) / (rowsPerLine * racksPerLine * maxGpus));
      return Math.max(2, Math.min(CELL_MAX[level], s));
    };
    // Pick the arrangement with the biggest cells that still fits the window's height: a
    // small fleet puts several rows side by side, a big one wraps a row's racks.
    const availH = Math.max(320, window.innerHeight - 300);
    let best = null;
    const tryLayout = (rowsPerLine, racksPerLine) => {
      const s = cellFor(rowsPerLine, racksPerLine);
      const rackLines = Math.ceil(maxRacks / racksPerLine);
      const lines = Math.ceil(rows.length / rowsPerLine);
      const h = lines * (rowLabelH + rackLines * (rackLabelFor(s) + maxNodes * s + lineGapFor(s)));
      const score = (s >= 5 ? s : s / 4) * Math.min(1, availH / h) ** 2;
      if (!best || score > best.score + 1e-9) best = { score, s, rowsPerLine, racksPerLine };
    };
    // (an empty fleet, before the first rollups, still gets a layout: no cells)
    for (let r = 1; r <= (level === "cluster" ? Math.max(1, rows.length) : 1); r++) tryLayout(r, maxRacks);
    for (let k = maxRacks - 1; k >= 1 && best.s < 5; k--) tryLayout(1, k);
    const { s, rowsPerLine, racksPerLine } = best;
    const rackLabelH = rackLabelFor(s);
    const rackW = nodeLabelW + maxGpus * s;
    const rowW = racksPerLine * (rackW + rackGap) - rackGap;
    const cells = { idx, x: new Float32Array(idx.length), y: new Float32Array(idx.length) };
    const groups = [];
    let y = pad;
    let c = 0;
    for (let r0 = 0; r0 < rows.length; r0 += rowsPerLine) {
      let lineBottom = y;
      rows.slice(r0, r0 + rowsPerLine).forEach((row, col) => {
        const x0 = pad + col * (rowW + rowGapX);
        let yy = y;
        const rowPath = [row.cluster, row.name];
        const labelRect = { x: x0, y: yy, w: Math.min(160, rowW), h: rowLabelH };
        yy += rowLabelH;
        for (let k0 = 0; k0 < row.racks.length; k0 += racksPerLine) {
          const line = row.racks.slice(k0, k0 + racksPerLine);
          const lineNodes = Math.max(...line.map((k) => k.nodes.length));
          let x = x0;
          for (const rack of line) {
            const rackPath = rowPath.concat([rack.name]);
            const rackH = rackLabelH + lineNodes * s;
            groups.push({ level: "rack", path: rackPath, x, y: yy, w: rackW, h: rackH, label: rack.name,
              labelRect: rackLabelH ? { x: x + nodeLabelW, y: yy, w: rackW - nodeLabelW, h: rackLabelH } : null });
            rack.nodes.forEach((node, j) => {
              // Slot 0 at the bottom, as in a physical rack (upper nodes breathe warmer air).
              const ny = yy + rackLabelH + (lineNodes - 1 - j) * s;
              groups.push({ level: "node", path: rackPath.concat([node.name]), x, y: ny, w: rackW, h: s,
                label: node.name, labelRect: deep ? { x, y: ny, w: nodeLabelW, h: s } : null });
              node.gpus.forEach((i, k) => {
                cells.x[c] = x + nodeLabelW + k * s;
                cells.y[c] = ny;
                c++;
              });
            });
            x += rackW + rackGap;
          }
          yy += rackLabelH + lineNodes * s + lineGapFor(s);
        }
        groups.push({ level: "row", path: rowPath, x: x0, y, w: rowW, h: yy - y, label: row.name, labelRect });
        lineBottom = Math.max(lineBottom, yy);
      });
      y = lineBottom;
    }
    // Cell order must follow idx; nodes were visited in idx order, so it does.
    return { level, s, cells, groups, height: Math.ceil(y + pad), width, rows: rows.length, nodeLabelW };
  }

  // ---------------------------------------------------------------- colours
  // 256 CSS colours interpolated between the stops (hex strings), low to high.
  function ramp(hexStops) {
    const hex = (h) => [1, 3, 5].map((o) => parseInt(h.slice(o, o + 2), 16));
    const stops = hexStops.map(hex);
    const out = [];
    for (let k = 0; k < 256; k++) {
      const p = (k / 255) * (stops.length - 1);
      const a = Math.floor(p), b = Math.min(stops.length - 1, a + 1), f = p - a;
      const rgb = stops[a].map((v, j) => Math.round(v + (stops[b][j] - v) * f));
      out.push(`rgb(${rgb[0]},${rgb[1]},${rgb[2]})`);
    }
    return out;
  }
  const LUT = ramp(VIRIDIS);
  const HEALTH_LUT = ramp(HEALTH_RAMP);

  function metricColour(v) {
    if (!Number.isFinite(v)) return MISSING;
    const [lo, hi] = S.domain;
    const k = Math.round(((v - lo) / (hi - lo)) * 255);
    return LUT[Math.max(0, Math.min(255, k))];
  }

  function scoreOf(i) {
    const s = S.scores[S.gpus[i].path];
    if (!s) return NaN;
    return s.threshold > 0 ? s.score / s.threshold : s.score;
  }

  // One number per GPU from its web/health row, in health_rank's order: incidents rooted at
  // the GPU first, then hardware events (XIDs, ECC, remaps) as a fraction below one
  // incident, hw / (hw + 1). So a GPU with more incidents always scores higher, hardware
  // events only tell apart GPUs with as many incidents, and a count reads off the legend:
  // 1 = one incident. Throttled and lost time, health_rank's last tie-break, is left to the
  // tooltip: it comes with an incident when it matters. 0 = healthy (absent from the answer).
  function healthScore(i) {
    const h = S.health.get(S.gpus[i].path);
    if (!h) return 0;
    const hw = h.xids + h.ecc + h.remaps;
    return h.incidents + hw / (hw + 1);
  }

  function healthColour(v) {
    return HEALTH_LUT[Math.max(0, Math.min(255, Math.round((v / HEALTH_TOP) * 255)))];
  }

  function cellColour(i, frame, alerts) {
    if (S.mode === "health:alerts") {
      const r = alerts.gpu[i];
      if (r) return SEVERITY_COLOR[r];
      return frame && Number.isNaN(frame[i]) ? MISSING : HEALTH_OK;
    }
    if (S.mode === "health:score") {
      const v = scoreOf(i);
      if (!Number.isFinite(v)) return MISSING;
      return LUT[Math.max(0, Math.min(255, Math.round((v / 2) * 255)))];
    }
    if (S.mode === "health:rank") return healthColour(healthScore(i));
    return metricColour(frame ? frame[i] : NaN);
  }

  // ---------------------------------------------------------------- drawing
  const canvas = $("heatmap");
  const ctx = canvas.getContext("2d");

  function render() {
    const t0 = performance.now();
    if (S.view.length === 1 && !S.view[0] && S.gpus.length) {
      // the page opened before any data: the cluster is known now
      S.view = [S.gpus[0].cluster];
      renderCrumbs();
    }
    const width = Math.max(320, canvas.parentElement.clientWidth);
    const L = (S.layout = computeLayout(width));
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(L.height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(L.height * dpr);
      canvas.style.height = L.height + "px";
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#101418";
    ctx.fillRect(0, 0, width, L.height);
    const frame = S.frames[S.frame];
    const alerts = alertState(frameTimeMs());
    const s = L.s;
    const inner = s >= 4 ? s - 1 : s;
    const { idx, x, y } = L.cells;
    for (let c = 0; c < idx.length; c++) {
      ctx.fillStyle = cellColour(idx[c], frame, alerts);
      ctx.fillRect(x[c], y[c], inner, inner);
    }
    drawLabels(L, frame, alerts);
    const highlighted = drawHighlights(L, alerts);
    const level = L.level;
    const childLevel = LEVELS[Math.min(4, LEVELS.indexOf(level) + 1)];
    canvas.dataset.cells = String(idx.length);
    canvas.dataset.view = level;
    canvas.dataset.entity = entityPath();
    canvas.dataset.groups = String(L.groups.filter((g) => g.level === childLevel).length);
    canvas.dataset.rows = String(L.rows);
    canvas.dataset.highlighted = highlighted.join(" ");
    canvas.dataset.unhealthy = unhealthyInView(L).join(" ");
    canvas.dataset.frame = String(S.frame);
    canvas.dataset.renderMs = (performance.now() - t0).toFixed(1);
    $("map-title").textContent = titleText();
    drawLegend();
    updateScrubber();
    drawCharts();
    renderAlertList(alerts);
  }

  // In the health mode: paths of the cells in view coloured above healthy, worst first.
  function unhealthyInView(L) {
    if (S.mode !== "health:rank") return [];
    const out = [];
    for (const i of L.cells.idx) {
      const v = healthScore(i);
      if (v > 0) out.push([v, S.gpus[i].path]);
    }
    out.sort((a, b) => b[0] - a[0] || (a[1] < b[1] ? -1 : 1));
    return out.map((x) => x[1]);
  }

  function drawLabels(L, frame, alerts) {
    ctx.textBaseline = "top";
    for (const g of L.groups) {
      if (g.level === "row") {
        ctx.fillStyle = "#d8dee6";
        ctx.font = "600 12px system-ui, sans-serif";
        ctx.fillText(g.label, g.x, g.y + 2);
      } else if (g.level === "rack" && g.labelRect) {
        ctx.fillStyle = "#8a96a3";
        ctx.font = `${Math.min(12, Math.max(9, L.s))}px system-ui, sans-serif`;
        ctx.fillText(g.label, g.labelRect.x, g.y + 1);
      } else if (g.level === "node" && g.labelRect) {
        ctx.fillStyle = "#8a96a3";
        ctx.font = `${Math.min(12, Math.max(9, L.s * 0.45))}px system-ui, sans-serif`;
        ctx.textBaseline = "middle";
        ctx.fillText(g.label, g.x, g.y + L.s / 2);
        ctx.textBaseline = "top";
      }
    }
    if (L.s < 28) return;
    // Big cells: GPU index and the value, so a rack view reads like a table.
    const unit = unitOf(S.metric);
    ctx.textAlign = "center";
    const { idx, x, y } = L.cells;
    for (let c = 0; c < idx.length; c++) {
      const i = idx[c];
      const cx = x[c] + (L.s - 1) / 2;
      ctx.fillStyle = textOn(cellColour(i, frame, alerts));
      ctx.font = `${Math.round(L.s * 0.2)}px system-ui, sans-serif`;
      ctx.textBaseline = "top";
      ctx.fillText(`gpu ${S.gpus[i].gpu}`, cx, y[c] + 3);
      if (S.mode.startsWith("metric:") && frame) {
        ctx.font = `600 ${Math.round(L.s * 0.24)}px system-ui, sans-serif`;
        ctx.textBaseline = "middle";
        ctx.fillText(formatValue(frame[i], unit), cx, y[c] + L.s * 0.6);
      }
    }
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
  }

  // Dark text on bright cells, light text on dark ones.
  function textOn(colour) {
    let r, g, b;
    const m = /^rgb\((\d+),(\d+),(\d+)\)$/.exec(colour);
    if (m) [r, g, b] = [Number(m[1]), Number(m[2]), Number(m[3])];
    else [r, g, b] = [1, 3, 5].map((o) => parseInt(colour.slice(o, o + 2), 16));
    return 0.299 * r + 0.587 * g + 0.114 * b > 150 ? "rgba(16,20,24,0.9)" : "rgba(255,255,255,0.9)";
  }

  function drawHighlights(L, alerts) {
    const highlighted = [];
    const { idx, x, y } = L.cells;
    const s = L.s;
    const lw = Math.max(1.5, Math.min(3, s / 6));
    ctx.lineWidth = lw;
    for (let c = 0; c < idx.length; c++) {
      const i = idx[c];
      const r = alerts.gpu[i];
      if (!r) continue;
      highlighted.push(S.gpus[i].path);
      if (S.mode === "health:alerts") {
        // The fill already says it; a white ring keeps it findable at small sizes.
        ctx.strokeStyle = "#ffffff";
      } else {
        ctx.strokeStyle = SEVERITY_COLOR[r];
      }
      const o = Math.max(lw, 2);
      const stroke = ctx.strokeStyle;
      // a dark halo first, so the ring reads on bright and dark cells alike
      ctx.strokeStyle = "#101418";
      ctx.lineWidth = lw + 2;
      ctx.strokeRect(x[c] - o / 2, y[c] - o / 2, s - 1 + o, s - 1 + o);
      ctx.strokeStyle = stroke;
      ctx.lineWidth = lw;
      ctx.strokeRect(x[c] - o / 2, y[c] - o / 2, s - 1 + o, s - 1 + o);
    }
    for (const g of L.groups) {
      const r = alerts.groups.get(g.path.join("/"));
      if (!r) continue;
      ctx.strokeStyle = SEVERITY_COLOR[r];
      ctx.setLineDash([4, 3]);
      ctx.strokeRect(g.x - 3, g.y - 3, g.w + 6, g.h + 6);
      ctx.setLineDash([]);
    }
    if (S.selected >= 0) {
      const c = idx.indexOf(S.selected);
      if (c >= 0) {
        ctx.strokeStyle = "#ffffff";
        ctx.lineWidth = 3;
        ctx.strokeRect(x[c] - 4, y[c] - 4, s + 7, s + 7);
      }
    }
    return highlighted;
  }

  function drawLegend() {
    const bar = $("legend-bar");
    const c = bar.getContext("2d");
    const mode = S.mode;
    const lut = mode === "health:rank" ? HEALTH_LUT : LUT;
    for (let k = 0; k < bar.width; k++) {
      c.fillStyle = lut[Math.round((k / (bar.width - 1)) * 255)];
      c.fillRect(k, 0, 1, bar.height);
    }
    $("legend").title = mode === "health:rank"
      ? `health (${HEALTH_SPAN}): incidents rooted at the GPU; hardware events (XIDs, ECC, ` +
        "remaps) add less than one incident. Hover a GPU for its counts." : "";
    if (mode === "health:alerts") {
      const parts = [[HEALTH_OK, 0.4], [SEVERITY_COLOR[1], 0.2], [SEVERITY_COLOR[2], 0.2], [SEVERITY_COLOR[3], 0.2]];
      let x0 = 0;
      for (const [col, w] of parts) {
        c.fillStyle = col;
        c.fillRect(x0, 0, w * bar.width, bar.height);
        x0 += w * bar.width;
      }
      $("legend-min").textContent = "healthy";
      $("legend-max").textContent = "critical";
    } else if (mode === "health:rank") {
      $("legend-min").textContent = "healthy";
      $("legend-max").textContent = `${HEALTH_TOP}+ incidents in ${HEALTH_SPAN}`;
    } else if (mode === "health:score") {
      $("legend-min").textContent = "score 0";
      $("legend-max").textContent = "2× threshold";
    } else {
      const unit = unitOf(S.metric);
      $("legend-min").textContent = formatValue(S.domain[0], unit);
      $("legend-max").textContent = formatValue(S.domain[1], unit);
    }
  }

  function unitOf(name) {
    const m = S.metrics.find((x) => x.name === name);
    return m ? m.unit : "";
  }

  function formatValue(v, unit) {
    if (!Number.isFinite(v)) return "–";
    const scaled = (div, u, d = 1) => `${(v / div).toFixed(d)} ${u}`;
    switch (unit) {
      case "celsius": return `${v.toFixed(0)} °C`;
      case "watts": return `${v.toFixed(0)} W`;
      case "ratio": return `${(v * 100).toFixed(0)} %`;
      case "hertz": return scaled(1e6, "MHz", 0);
      case "bytes": return v >= 1e9 ? scaled(1e9, "GB") : scaled(1e6, "MB", 0);
      case "bytes_per_second": return v >= 1e9 ? scaled(1e9, "GB/s") : scaled(1e6, "MB/s");
      case "joules": return v >= 1e6 ? scaled(1e6, "MJ") : scaled(1e3, "kJ");
      default: {
        const a = Math.abs(v);
        if (a !== 0 && (a >= 1e5 || a < 1e-2)) return v.toExponential(2);
        return String(Math.round(v * 100) / 100);
      }
    }
  }

  function fmtDuration(sec) {
    if (sec < 60) return `${Math.round(sec)} s`;
    if (sec < 3600) return `${(sec / 60).toFixed(1)} min`;
    if (sec < 86400) return `${(sec / 3600).toFixed(1)} h`;
    return `${(sec / 86400).toFixed(1)} d`;
  }

  function fmtTime(sec) {
    const d = new Date(sec * 1000);
    return d.toISOString().slice(11, 19) + " UTC";
  }

  // ---------------------------------------------------------------- interaction
  function entityPath() {
    const parts = S.view.slice();
    if (S.selected >= 0) return S.gpus[S.selected].path;
    return parts.join("/");
  }

  function hit(px, py) {
    const L = S.layout;
    if (!L) return null;
    const { idx, x, y } = L.cells;
    for (let c = 0; c < idx.length; c++) {
      if (px >= x[c] && px < x[c] + L.s && py >= y[c] && py < y[c] + L.s) return { gpu: idx[c] };
    }
    return null;
  }

  function groupAt(px, py, level) {
    for (const g of S.layout.groups) {
      if (g.level === level && px >= g.x && px < g.x + g.w && py >= g.y && py < g.y + g.h) return g;
    }
    return null;
  }

  function labelAt(px, py) {
    for (const g of S.layout.groups) {
      const r = g.labelRect;
      if (r && px >= r.x && px < r.x + r.w && py >= r.y && py < r.y + r.h) return g;
    }
    return null;
  }

  function navigate(path, gpuIndex) {
    S.view = path.slice(0, 4);
    S.selected = gpuIndex === undefined ? -1 : gpuIndex;
    writeHash();
    render();
    loadCharts();
  }

  canvas.addEventListener("click", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left, py = ev.clientY - rect.top;
    const level = viewLevel();
    const label = labelAt(px, py);
    if (label && LEVELS.indexOf(label.level) > LEVELS.indexOf(level)) {
      navigate(label.path);
      return;
    }
    const child = LEVELS[Math.min(4, Math.max(LEVELS.indexOf(level), 0) + 1)];
    const cell = hit(px, py);
    if (child === "gpu" || level === "gpu") {
      if (cell) {
        const g = S.gpus[cell.gpu];
        navigate([g.cluster, g.row, g.rack, g.node], cell.gpu);
      }
      return;
    }
    const g = groupAt(px, py, child);
    if (g) navigate(g.path);
  });

  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left, py = ev.clientY - rect.top;
    const tip = $("tooltip");
    const cell = hit(px, py);
    if (!cell) { tip.hidden = true; return; }
    const g = S.gpus[cell.gpu];
    const frame = S.frames[S.frame];
    const lines = [g.path, `${S.metric}: ${formatValue(frame ? frame[cell.gpu] : NaN, unitOf(S.metric))}`];
    const sc = scoreOf(cell.gpu);
    if (Number.isFinite(sc)) lines.push(`anomaly score: ${sc.toFixed(2)} × threshold`);
    if (S.mode === "health:rank") {
      const h = S.health.get(g.path);
      lines.push(h
        ? `health (${HEALTH_SPAN}): ${h.incidents} incidents · ${h.xids} XIDs · ${h.ecc} ECC · ` +
          `${h.remaps} remaps\nthrottled ${fmtDuration(h.throttled_s)} · lost ${fmtDuration(h.lost_s)}`
        : `health (${HEALTH_SPAN}): nothing in the window`);
    }
    for (const a of S.alerts) {
      if (a.entity === g.path && a.state === "firing") lines.push(`⚠ ${a.severity}: ${a.summary}`);
    }
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(px + 14, rect.width - 260) + "px";
    tip.style.top = py + 14 + "px";
  });
  canvas.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });

  function renderCrumbs() {
    const nav = $("crumbs");
    nav.textContent = "";
    const parts = S.view.slice();
    const items = parts.map((p, d) => ({ label: p, path: parts.slice(0, d + 1), gpu: undefined }));
    if (S.selected >= 0) items.push({ label: `gpu ${S.gpus[S.selected].gpu}`, path: parts, gpu: S.selected });
    items.forEach((it, k) => {
      if (k) {
        const sep = document.createElement("span");
        sep.className = "sep";
        sep.textContent = "›";
        nav.appendChild(sep);
      }
      const a = document.createElement("a");
      a.textContent = it.label;
      a.dataset.level = LEVELS[k];
      if (k === items.length - 1) a.className = "current";
      a.addEventListener("click", () => navigate(it.path, it.gpu));
      nav.appendChild(a);
    });
    $("map-title").textContent = titleText();
  }

  function titleText() {
    const what = S.mode === "health:alerts" ? "alert state"
      : S.mode === "health:score" ? "anomaly score"
      : S.mode === "health:rank" ? `health (${HEALTH_SPAN})` : S.metric.replace(/^fleetpulse_gpu_/, "");
    return `${viewLevel()} · ${S.layout ? S.layout.cells.idx.length.toLocaleString() : 0} GPUs · ${what}`;
  }

  function renderAlertList(alerts) {
    const ol = $("alerts");
    const list = S.alerts.slice().sort((a, b) =>
      (b.state === "firing") - (a.state === "firing") || b.updated_ms - a.updated_ms);
    const firing = list.filter((a) => a.state === "firing").length;
    $("alert-count").textContent = `${firing} firing · ${list.length} recent`;
    const sig = list.map((a) => a.id + a.state + a.updated_ms).join("|");
    if (ol.dataset.sig === sig) return;
    ol.dataset.sig = sig;
    ol.textContent = "";
    for (const a of list.slice(0, 200)) {
      const li = document.createElement("li");
      li.className = `${a.severity} ${a.state}`;
      li.dataset.entity = a.entity;
      li.dataset.level = a.level;
      const ent = document.createElement("div");
      ent.className = "entity";
      // zero-width spaces after the slashes: long paths wrap between names, not inside them
      ent.textContent = `${a.state === "firing" ? "●" : "○"} ${a.entity.replace(/\//g, "/\u200b")}`;
      const sum = document.createElement("div");
      sum.className = "summary";
      sum.textContent = a.summary;
      const meta = document.createElement("div");
      meta.className = "meta";
      meta.textContent = `${a.severity} · ${a.source} · score ${Number(a.score).toFixed(2)}` +
        ` / ${Number(a.threshold).toFixed(2)} · since ${fmtTime(a.started_ms / 1000)}`;
      li.append(ent, sum, meta);
      if (a.attribution && a.attribution.length) {
        const at = document.createElement("div");
        at.className = "attr";
        at.textContent = a.attribution.slice(0, 3).map((x) =>
          `${x.metric.replace(/^fleetpulse_gpu_/, "")} ${x.direction === "low" ? "↓" : "↑"} ${(x.weight * 100).toFixed(0)}%`).join("  ");
        li.append(at);
      }
      li.addEventListener("click", () => goToEntity(a.entity, a.level));
      ol.appendChild(li);
    }
    void alerts;
  }

  function goToEntity(entity, level) {
    const i = S.byPath.get(entity);
    if (i !== undefined) {
      const g = S.gpus[i];
      navigate([g.cluster, g.row, g.rack, g.node], i);
      return;
    }
    const parts = entity.split("/");
    const depth = Math.max(1, LEVELS.indexOf(level) + 1);
    navigate(parts.slice(0, Math.min(4, depth)));
  }

  // ---------------------------------------------------------------- scrubber
  const scrub = $("scrub");
  function updateScrubber() {
    scrub.max = String(Math.max(0, S.frames.length - 1));
    scrub.value = String(Math.max(0, S.frame));
    $("live").classList.toggle("on", S.live);
    $("frame-time").textContent = S.times.length && S.frame >= 0
      ? `${fmtTime(S.times[S.frame])}${S.live ? " (live)" : ""}` : "";
  }
  scrub.addEventListener("input", () => {
    S.frame = Number(scrub.value);
    S.live = S.frame === S.frames.length - 1 && S.live;
    if (S.frame !== S.frames.length - 1) S.live = false;
    stopPlay();
    render();
  });
  $("live").addEventListener("click", () => {
    S.live = true;
    S.frame = S.frames.length - 1;
    stopPlay();
    render();
  });
  function stopPlay() {
    if (S.playing) clearInterval(S.playing);
    S.playing = 0;
    $("play").textContent = "▶";
  }
  $("play").addEventListener("click", () => {
    if (S.playing) { stopPlay(); return; }
    S.live = false;
    if (S.frame >= S.frames.length - 1) S.frame = 0;
    $("play").textContent = "❚❚";
    S.playing = setInterval(() => {
      if (S.frame >= S.frames.length - 1) { stopPlay(); return; }
      S.frame++;
      render();
    }, S.cfg.play_interval_ms);
  });

  // ---------------------------------------------------------------- charts
  function entityLabels() {
    const keys = ["cluster", "row", "rack", "node"];
    const labels = {};
    S.view.forEach((v, d) => { labels[keys[d]] = v; });
    if (S.selected >= 0) labels.gpu = S.gpus[S.selected].gpu;
    return labels;
  }

  async function loadCharts() {
    const seq = ++S.chartSeq;
    const level = viewLevel();
    const labels = entityLabels();
    const metrics = level === "gpu"
      ? [S.metric].concat(S.cfg.chart_metrics.filter((m) => m !== S.metric && S.metrics.some((x) => x.name === m)))
      : [S.metric];
    if (!S.times.length) return;
    const start = S.times[0], end = S.times[S.times.length - 1];
    const step = S.step;
    const out = await Promise.all(metrics.map(async (name) => {
      try {
        const data = await prom("api/v1/query_range", {
          query: selector(name, level, labels), start, end: Math.max(end, start + step), step,
        });
        return { name, unit: unitOf(name), series: data.result.slice(0, 8).map((s) => ({
          label: s.metric.agg || s.metric.__name__ || name,
          t: s.values.map((p) => p[0]), v: s.values.map((p) => parseFloat(p[1])),
        })) };
      } catch (err) {
        return { name, unit: unitOf(name), series: [], error: String(err.message || err) };
      }
    }));
    if (seq !== S.chartSeq) return;
    S.charts = out;
    buildChartDom();
    drawCharts();
  }

  function buildChartDom() {
    const box = $("charts");
    box.textContent = "";
    box.dataset.entity = entityPath();
    S.charts.forEach((ch, k) => {
      const div = document.createElement("div");
      div.className = "chart";
      const h = document.createElement("h3");
      h.textContent = `${ch.name.replace(/^fleetpulse_gpu_/, "")} — ${entityPath()} (${viewLevel()})` +
        (ch.error ? ` · ${ch.error}` : ch.series.length ? "" : " · no data");
      const c = document.createElement("canvas");
      c.dataset.chart = String(k);
      c.dataset.series = String(ch.series.length);
      c.dataset.points = String(ch.series.reduce((n, s) => n + s.t.length, 0));
      div.append(h, c);
      box.appendChild(div);
    });
  }

  function drawCharts() {
    const cursor = S.times[S.frame];
    document.querySelectorAll("#charts canvas").forEach((c) => {
      const ch = S.charts[Number(c.dataset.chart)];
      if (ch) drawChart(c, ch, cursor);
    });
  }

  function drawChart(c, ch, cursor) {
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 400, h = c.clientHeight || 150;
    if (c.width !== Math.round(w * dpr)) { c.width = Math.round(w * dpr); c.height = Math.round(h * dpr); }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const m = { l: 64, r: 8, t: 6, b: 18 };
    const t0 = S.times[0], t1 = Math.max(S.times[S.times.length - 1], t0 + 1);
    let lo = Infinity, hi = -Infinity;
    for (const s of ch.series) for (const v of s.v) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    if (!Number.isFinite(lo)) { lo = 0; hi = 1; }
    if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
    const padY = (hi - lo) * 0.06;
    lo -= padY; hi += padY;
    const X = (t) => m.l + ((t - t0) / (t1 - t0)) * (w - m.l - m.r);
    const Y = (v) => m.t + (1 - (v - lo) / (hi - lo)) * (h - m.t - m.b);
    // Alert spans of this entity and everything under it.
    const path = entityPath();
    g.fillStyle = "rgba(255,77,79,0.16)";
    for (const a of S.alerts) {
      if (!(a.entity === path || a.entity.startsWith(path + "/") || path.startsWith(a.entity + "/"))) continue;
      const a0 = Math.max(t0, a.started_ms / 1000);
      const a1 = Math.min(t1, a.state === "firing" ? t1 : a.updated_ms / 1000);
      if (a1 > a0) g.fillRect(X(a0), m.t, Math.max(2, X(a1) - X(a0)), h - m.t - m.b);
    }
    g.strokeStyle = "#2a323c";
    g.fillStyle = "#8a96a3";
    g.font = "10px system-ui, sans-serif";
    g.lineWidth = 1;
    g.textBaseline = "middle";
    for (let k = 0; k <= 3; k++) {
      const v = lo + ((hi - lo) * k) / 3;
      const yy = Math.round(Y(v)) + 0.5;
      g.beginPath(); g.moveTo(m.l, yy); g.lineTo(w - m.r, yy); g.stroke();
      g.textAlign = "right";
      g.fillText(formatValue(v, ch.unit), m.l - 4, yy);
    }
    g.textAlign = "center";
    g.textBaseline = "top";
    for (let k = 0; k <= 4; k++) {
      const t = t0 + ((t1 - t0) * k) / 4;
      g.fillText(fmtTime(t).slice(0, 5), Math.min(w - 20, Math.max(m.l + 14, X(t))), h - m.b + 4);
    }
    ch.series.forEach((s, j) => {
      g.strokeStyle = LINE_COLORS[j % LINE_COLORS.length];
      g.lineWidth = 1.5;
      g.beginPath();
      let pen = false;
      for (let k = 0; k < s.t.length; k++) {
        if (!Number.isFinite(s.v[k])) { pen = false; continue; }
        const px = X(s.t[k]), py = Y(s.v[k]);
        if (pen) g.lineTo(px, py); else g.moveTo(px, py);
        pen = true;
      }
      g.stroke();
      if (ch.series.length > 1) {
        g.fillStyle = g.strokeStyle;
        g.textAlign = "left";
        g.fillText(s.label, m.l + 6 + j * 60, m.t + 2);
      }
    });
    if (Number.isFinite(cursor)) {
      g.strokeStyle = "rgba(255,255,255,0.7)";
      g.lineWidth = 1;
      g.beginPath(); g.moveTo(X(cursor), m.t); g.lineTo(X(cursor), h - m.b); g.stroke();
    }
  }

  // ---------------------------------------------------------------- modes and URL state
  function buildModeSelect() {
    const sel = $("mode");
    sel.textContent = "";
    const grp = document.createElement("optgroup");
    grp.label = "metric";
    for (const m of S.metrics) {
      const o = document.createElement("option");
      o.value = `metric:${m.name}`;
      o.textContent = m.name.replace(/^fleetpulse_gpu_/, "");
      o.title = m.help;
      grp.appendChild(o);
    }
    const hg = document.createElement("optgroup");
    hg.label = "health";
    for (const [v, t] of [["health:alerts", "alert state"], ["health:score", "anomaly score"],
      ["health:rank", `health (${HEALTH_SPAN})`]]) {
      const o = document.createElement("option");
      o.value = v;
      o.textContent = t;
      hg.appendChild(o);
    }
    sel.append(grp, hg);
    sel.value = S.mode;
    sel.addEventListener("change", () => setMode(sel.value));
  }

  async function setMode(mode) {
    S.mode = mode;
    writeHash();
    if (mode.startsWith("metric:") && mode.slice(7) !== S.metric) {
      S.metric = mode.slice(7);
      try {
        await loadRange();
      } catch (err) {
        setStatus(String(err.message || err), true);
      }
      loadCharts();
    }
    if (mode === "health:rank") {
      try {
        await refreshHealth();
      } catch (err) {
        setStatus(String(err.message || err), true);
      }
    }
    renderCrumbs();
    render();
  }

  function writeHash() {
    const p = new URLSearchParams();
    p.set("mode", S.mode);
    if (S.view.length) p.set("view", S.view.join("/"));
    if (S.selected >= 0) p.set("gpu", S.gpus[S.selected].gpu);
    history.replaceState(null, "", "#" + p.toString());
    renderCrumbs();
  }

  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    return { mode: p.get("mode"), view: p.get("view"), gpu: p.get("gpu") };
  }

  function setStatus(text, error) {
    const el = $("status");
    el.textContent = text;
    el.classList.toggle("error", Boolean(error));
  }

  // ---------------------------------------------------------------- main loop
  async function tick() {
    try {
      await refreshAlerts();
      if (S.mode === "health:rank") await refreshHealth();
      if (S.mode.startsWith("metric:") || S.mode === "health:alerts") await extendRange();
      if (!S.playing) render();
      const n = S.alerts.filter((a) => a.state === "firing").length;
      setStatus(`${S.gpus.length.toLocaleString()} GPUs · ${n} firing · data to ` +
        `${S.times.length ? fmtTime(S.times[S.times.length - 1]) : "–"}`);
    } catch (err) {
      setStatus(String(err.message || err), true);
    }
  }

  async function main() {
    try {
      S.cfg = (await getJSON("web/config.json")).data;
      S.nowMs = S.cfg.now_ms;
      S.metrics = S.cfg.metrics;
      try {
        const present = new Set(await prom("api/v1/label/__name__/values", {}));
        const have = S.metrics.filter((m) => present.has(m.name));
        if (have.length) S.metrics = have;
      } catch (err) {
        // An API without label values still serves the catalog's metrics.
      }
      const h = readHash();
      const firstMetric = S.metrics.some((m) => m.name === S.cfg.default_metric)
        ? S.cfg.default_metric : (S.metrics[0] || { name: S.cfg.default_metric }).name;
      S.mode = h.mode && (h.mode.startsWith("health:") || S.metrics.some((m) => `metric:${m.name}` === h.mode))
        ? h.mode : `metric:${firstMetric}`;
      S.metric = S.mode.startsWith("metric:") ? S.mode.slice(7) : firstMetric;
      buildModeSelect();
      await refreshAlerts();
      await loadRange();
      if (S.mode === "health:rank") {
        try {
          await refreshHealth();
        } catch (err) {
          setStatus(String(err.message || err), true);
        }
      }
      const cluster = S.gpus.length ? S.gpus[0].cluster : "";
      S.view = h.view ? h.view.split("/").slice(0, 4) : [cluster];
      if (h.gpu !== null && S.view.length === 4) {
        const i = S.byKey.get(S.view.join("/") + "/" + h.gpu);
        if (i !== undefined) S.selected = i;
      }
      renderCrumbs();
      render();
      loadCharts();
      canvas.dataset.ready = "1";
      setInterval(tick, S.cfg.refresh_s * 1000);
      window.addEventListener("resize", () => render());
    } catch (err) {
      setStatus(String(err.message || err), true);
      canvas.dataset.error = String(err.message || err);
    }
  }

  // A small handle for tests and the console: where things are drawn, in CSS pixels.
  window.fleetpulse = {
    state: S,
    render,
    groupCenter(path) {
      const g = S.layout && S.layout.groups.find((x) => x.path.join("/") === path);
      return g ? { x: g.x + g.w / 2, y: g.y + g.h / 2, level: g.level } : null;
    },
    cellCenter(path) {
      const i = S.byPath.get(path);
      const L = S.layout;
      if (i === undefined || !L) return null;
      const c = L.cells.idx.indexOf(i);
      return c < 0 ? null : { x: L.cells.x[c] + L.s / 2, y: L.cells.y[c] + L.s / 2 };
    },
  };

  main();
})();
