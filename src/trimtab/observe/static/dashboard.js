// trimtab's live dashboard: reads the coordinator's event stream (server-sent events
// from /api/stream, or polling /api/events where those fail) and draws it with uPlot.
"use strict";

const COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f",
                "#ad1457", "#4e342e", "#558b2f", "#283593"];
const KEEP = 1500;  // x values kept per chart
const TIMELINE_KINDS = new Set(["job", "placement", "migration", "straggler", "saps",
  "member", "servers_wanted", "failover", "checkpoint", "refused", "end"]);

class Chart {
  // A uPlot chart of named series over a shared x axis; points arrive one at a time.
  constructor(id, xlabel, stepped = false) {
    this.el = document.getElementById(id);
    this.xlabel = xlabel;
    this.stepped = stepped;
    this.series = new Map();  // name -> Map(x -> y)
    this.plot = null;
    this.names = "";
    this.dirty = false;
  }
  add(name, x, y) {
    let points = this.series.get(name);
    if (!points) { points = new Map(); this.series.set(name, points); }
    points.set(x, y);
    if (points.size > KEEP) points.delete(points.keys().next().value);
    this.dirty = true;
  }
  count() {
    let n = 0;
    for (const p of this.series.values()) n += p.size;
    return n;
  }
  draw() {
    if (!this.dirty) return;
    this.dirty = false;
    const names = [...this.series.keys()].sort();
    const xs = new Set();
    for (const p of this.series.values()) for (const x of p.keys()) xs.add(x);
    const x = [...xs].sort((a, b) => a - b).slice(-KEEP);
    const data = [x, ...names.map(n => x.map(v => {
      const y = this.series.get(n).get(v);
      return y === undefined ? null : y;
    }))];
    const width = Math.max(300, this.el.clientWidth - 20);
    if (!this.plot || this.names !== names.join("|")) {
      if (this.plot) this.plot.destroy();
      this.names = names.join("|");
      this.plot = new uPlot({
        width, height: 220,
        scales: {x: {time: false}},
        axes: [{label: this.xlabel}, {}],
        series: [{label: this.xlabel},
                 ...names.map((n, i) => ({label: n, stroke: COLORS[i % COLORS.length],
                                          spanGaps: true, width: 1.5,
                                          paths: this.stepped
                                            ? uPlot.paths.stepped({align: 1}) : undefined,
                                          dash: n.endsWith("wait") ? [4, 3] : undefined}))],
      }, data, this.el);
    } else {
      this.plot.setData(data);
    }
    this.el.dataset.points = String(this.count());
  }
}

const charts = {
  step: new Chart("chart-step", "step"),
  load: new Chart("chart-load", "seconds"),
  speed: new Chart("chart-speed", "seconds"),
  batch: new Chart("chart-batch", "step"),
  lag: new Chart("chart-lag", "step"),
  placement: new Chart("chart-placement", "seconds", true),
};

const job = {seq: 0, t0: null, lastLoad: new Map(), members: new Map(), stragglers: new Map(),
             clocks: new Map(), samples: [], migrations: 0, ended: false};

function $(id) { return document.getElementById(id); }

function take(e) {
  if (e.seq <= job.seq) return;  // (a reconnected stream may repeat some)
  job.seq = e.seq;
  if (job.t0 === null) job.t0 = e.t;
  const t = +(e.t - job.t0).toFixed(2);
  switch (e.kind) {
    case "job":
      $("job").textContent = `${e.job}: ${e.workers} workers, ${e.servers} servers, ` +
        `${e.placement}, ${e.consistency}, ${e.batching}`;
      break;
    case "step":
      charts.step.add(`worker ${e.rank} compute`, e.clock, e.compute_s);
      charts.step.add(`worker ${e.rank} wait`, e.clock, e.comm_s);
      charts.batch.add(`worker ${e.rank}`, e.clock, e.batch);
      charts.lag.add(`worker ${e.rank}`, e.clock, e.lag);
      job.clocks.set(e.rank, e.clock + 1);
      job.samples.push([e.t, e.batch]);
      while (job.samples.length && job.samples[0][0] < e.t - 10) job.samples.shift();
      break;
    case "load": {
      const before = job.lastLoad.get(e.server);
      job.lastLoad.set(e.server, [t, e.bytes]);
      if (before && t > before[0] && e.bytes >= before[1]) {
        charts.load.add(`server ${e.server}`, t, (e.bytes - before[1]) / (t - before[0]) / 1e6);
      }
      if (e.speed !== null && e.speed !== undefined) {
        charts.speed.add(`server ${e.server}`, t, e.speed / 1e6);
      }
      break;
    }
    case "placement":
      e.chunks.forEach((c, s) => charts.placement.add(`server ${s}`, t, c));
      drawMap(e);
      $("epoch").textContent = e.epoch;
      break;
    case "migration":
      if (e.phase === "done") job.migrations = e.migrations;
      break;
    case "member":
      job.members.set(`${e.role} ${e.rank}`, e.state);
      if (e.state === "lost" || e.state === "retired") job.stragglers.delete(`${e.role} ${e.rank}`);
      break;
    case "straggler":
      job.stragglers.set(`${e.role} ${e.rank}`, e.why);
      break;
    case "end":
      job.ended = true;
      break;
  }
  if (TIMELINE_KINDS.has(e.kind)) addToTimeline(e, t);
}

function drawMap(e) {
  const map = $("map");
  map.textContent = "";
  for (const owner of e.owners) {
    const cell = document.createElement("div");
    cell.style.background = COLORS[owner % COLORS.length];
    cell.title = `server ${owner}`;
    map.appendChild(cell);
  }
  $("map-epoch").textContent = `epoch ${e.epoch}: ${e.owners.length} chunks`;
  $("map-legend").innerHTML = e.chunks.map((c, s) =>
    `<span><i style="background:${COLORS[s % COLORS.length]}"></i>server ${s}: ${c} chunks, ` +
    `${(e.bytes[s] / 1e6).toFixed(2)} MB</span>`).join("");
}

function addToTimeline(e, t) {
  const li = document.createElement("li");
  li.className = `event ${e.kind}`;
  const what = Object.entries(e)
    .filter(([k]) => !["seq", "t", "kind", "owners"].includes(k))
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
  li.innerHTML = `<span class="t"></span><span class="k"></span><span class="w"></span>`;
  li.children[0].textContent = `${t.toFixed(1)} s`;
  li.children[1].textContent = e.kind === "migration" ? `migration ${e.phase}` : e.kind;
  li.children[2].textContent = what;
  const list = $("timeline");
  list.insertBefore(li, list.firstChild);
  while (list.children.length > 500) list.removeChild(list.lastChild);
}

function redraw() {
  for (const c of Object.values(charts)) c.draw();
  const clocks = [...job.clocks.values()];
  $("clock").textContent = clocks.length ? Math.min(...clocks) : 0;
  const s = job.samples;
  const span = s.length > 1 ? s[s.length - 1][0] - s[0][0] : 0;
  $("rate").textContent = span > 0 ? (s.reduce((a, b) => a + b[1], 0) / span).toFixed(0) : 0;
  const live = role => [...job.members].filter(([k, v]) => k.startsWith(role) &&
    !["lost", "retired", "done"].includes(v)).length;
  $("servers").textContent = live("server");
  $("workers").textContent = live("worker");
  $("migrations").textContent = job.migrations;
  $("stragglers").textContent = job.stragglers.size ? [...job.stragglers.keys()].join(", ") : "none";
  if (job.ended) setLink("ended", "job ended");
}

function setLink(cls, text) {
  const link = $("link");
  if (link.className === "ended") return;
  link.className = cls;
  link.textContent = text;
}

function takeBatch(batch) { for (const e of batch) take(e); }

function poll() {
  // The fallback: ask for the events after the last one seen, every second.
  setLink("polling", "polling");
  const next = () => {
    if (job.ended) return;
    fetch(`/api/events?since=${job.seq}`).then(r => r.json()).then(body => {
      takeBatch(body.events);
      setLink("polling", "polling");
      setTimeout(next, body.events.length >= 2000 ? 0 : 1000);
    }).catch(() => { setLink("lost", "disconnected"); setTimeout(next, 2000); });
  };
  next();
}

function stream() {
  if (!window.EventSource || location.hash === "#poll") { poll(); return; }
  const source = new EventSource(`/api/stream?since=${job.seq}`);
  let opened = false;
  source.onopen = () => { opened = true; setLink("live", "live"); };
  source.onmessage = m => takeBatch(JSON.parse(m.data));
  source.onerror = () => {
    if (job.ended) { source.close(); return; }
    if (!opened) { source.close(); poll(); }  // never worked here: poll instead
    else setLink("lost", "reconnecting");
  };
}

window.trimtabDashboard = {
  job,
  points: () => Object.fromEntries(Object.entries(charts).map(([k, c]) => [k, c.count()])),
};
setInterval(redraw, 500);
stream();
