// ferry's dashboard: reads the service's JSON API with the token the user gives once (kept in
// this tab's sessionStorage, sent as a bearer header, never put in a URL) and draws jobs,
// a job's rate and each link's history. Every value from the API goes in as text, never HTML.
'use strict';

const KEY = 'ferry-token';
const EVERY_MS = 1000;
// Link histories are long (thousands of samples) and change slowly: fetched less often.
const LINKS_EVERY_MS = 5000;
const SVG = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);
let selected = null;
let timer = null;
let linksAt = 0;

function token() { return sessionStorage.getItem(KEY); }

function status(text, bad) {
  $('status').textContent = text;
  $('status').className = bad ? 'error' : '';
}

// One API call; a 401 forgets the token, any other refusal throws with the service's words.
async function api(path, method, body) {
  const headers = { Authorization: 'Bearer ' + token() };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { method: method || 'GET', headers, body, cache: 'no-store' });
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  let why = (data && data.error) || r.status + ' ' + r.statusText;
  if (r.status === 401) {
    forget();
    why = 'The service refused the token: ' + why;
  }
  if (!r.ok) {
    const e = new Error(why);
    e.status = r.status;
    throw e;
  }
  return data;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function bytes(n) {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + ' ' + units[i];
}

function duration(s) {
  if (!isFinite(s) || s < 0) return '—';
  if (s < 1) return Math.round(s * 1000) + ' ms';
  if (s < 60) return Math.ceil(s) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.ceil(s % 60) + ' s';
  return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
}

function percent(j) {
  if (j.bytes_total > 0) return Math.min(100, Math.floor(j.bytes_done * 100 / j.bytes_total));
  return j.state === 'done' ? 100 : 0;
}

// The state in words: a queued job waiting out a retry's backoff says so.
function stateWords(j) {
  if (j.state === 'queued' && j.not_before_ms > Date.now()) {
    return 'waiting to retry (attempt ' + (j.attempts + 1) + ')';
  }
  if (j.state === 'queued') return 'queued';
  if (j.state === 'running') return j.attempts > 1 ? 'running (attempt ' + j.attempts + ')' : 'running';
  return j.state;
}

function jobRow(j) {
  const tr = el('tr');
  const pct = percent(j);
  tr.dataset.job = j.id;
  tr.dataset.state = j.state;
  tr.dataset.percent = pct;
  if (j.id === selected) tr.className = 'selected';
  tr.append(el('td', j.id), el('td', j.label || '—'),
    el('td', j.kind + ' ' + j.sources.join(', ') + ' → ' + j.dest),
    el('td', stateWords(j), 'state-' + j.state));
  const bar = el('progress');
  bar.max = 100;
  bar.value = pct;
  const prog = el('td');
  prog.append(bar, ' ' + pct + ' % of ' + bytes(j.bytes_total));
  const running = j.state === 'running';
  const eta = running && j.rate > 0 ? (j.bytes_total - j.bytes_done) / j.rate : NaN;
  const took = (j.finished_ms - j.started_ms) / 1000;
  const rate = running ? bytes(j.rate) + '/s'
    : j.state === 'done' && took > 0 ? 'average ' + bytes(j.bytes_total / took) + '/s' : '—';
  tr.append(prog, el('td', rate), el('td', duration(eta)),
    el('td', j.last_error || '', 'error'));
  const act = el('td');
  if (j.state === 'queued' || j.state === 'running') {
    const b = el('button', 'Cancel');
    b.type = 'button';
    b.dataset.cancel = j.id;
    act.append(b);
  }
  tr.append(act);
  return tr;
}

// A plot of `series` (each {values: [[t_ms, v]...], cls, right}) in an SVG the script builds;
// the raw samples stay readable in the container's data-points attribute.
function plot(box, samples, series, unitLeft, unitRight) {
  box.dataset.points = JSON.stringify(samples);
  box.replaceChildren();
  if (!samples.length) { box.append(el('p', 'no history yet', 'empty')); return; }
  const W = 600, H = 160, L = 56, R = 56, T = 10, B = 22;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('role', 'img');
  const ts = samples.map((s) => s.t_ms);
  const t0 = Math.min(...ts), t1 = Math.max(...ts, t0 + 1000);
  const x = (t) => L + (t - t0) / (t1 - t0) * (W - L - R);
  const node = (tag, attrs, text) => {
    const n = document.createElementNS(SVG, tag);
    for (const k in attrs) n.setAttribute(k, attrs[k]);
    if (text !== undefined) n.textContent = text;
    svg.append(n);
    return n;
  };
  node('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' });
  node('text', { x: L, y: H - 6 }, '0 s');
  node('text', { x: W - R, y: H - 6, 'text-anchor': 'end' }, duration((t1 - t0) / 1000));
  for (const s of series) {
    const pts = s.values.filter((p) => p[1] !== null && isFinite(p[1]));
    if (!pts.length) continue;
    const top = Math.max(...pts.map((p) => p[1]), 1e-9);
    const y = (v) => H - B - v / top * (H - B - T);
    const label = s.right ? top.toFixed(1) + ' ' + unitRight : unitLeft(top);
    node('text', s.right ? { x: W - R + 4, y: T + 8 } : { x: 2, y: T + 8 }, label);
    node('polyline', { class: s.cls, points: pts.map((p) => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' ') });
    // A lone sample has no line to draw; it and each transfer sample get a dot.
    for (const p of pts.filter((p) => p[2] || pts.length === 1)) {
      node('circle', { cx: x(p[0]), cy: y(p[1]), r: 3, class: p[2] ? 'transfer' : s.cls + '-dot' });
    }
  }
  box.append(svg);
}

const perSecond = (v) => bytes(v) + '/s';

async function drawRates() {
  const box = $('rate-plot');
  if (selected === null) { plot(box, [], []); return; }
  let samples = [];
  try {
    samples = (await api('/api/jobs/' + selected + '/rates')).samples || [];
  } catch (e) {
    if (e.status !== 404) throw e;
  }
  plot(box, samples, [{ values: samples.map((s) => [s.t_ms, s.rate]), cls: 'rate' }], perSecond);
}

async function drawLinks() {
  const box = $('links');
  let links = [];
  try {
    links = (await api('/api/links')).links || [];
  } catch (e) {
    if (e.status !== 404) throw e;
  }
  if (!links.length) { box.replaceChildren(el('p', 'no history yet', 'empty')); return; }
  const parts = await Promise.all(links.slice(0, 12).map(async (l) => {
    const div = el('div', undefined, l.flagged ? 'link flagged' : 'link');
    div.dataset.link = l.name;
    div.dataset.flagged = l.flagged;
    const words = [l.name, l.median_rate === null ? 'no median yet' : 'median ' + perSecond(l.median_rate)];
    if (l.last) words.push('last ' + perSecond(l.last.rate) + ' (' + l.last.source + ')');
    if (l.flagged) words.push('flagged: ' + (l.reason || 'slow'));
    if (l.tuning) {
      const t = l.tuning;
      words.push(t.jobs + (t.jobs === 1 ? ' job' : ' jobs') + ' at once' +
        (t.streams ? ', ' + t.streams + ' streams in all' : ''));
    }
    div.append(el('h3', words.join(' — ')));
    let samples = [];
    try {
      samples = (await api('/api/links/' + encodeURIComponent(l.name) + '/history')).samples || [];
    } catch (e) {
      if (e.status !== 404) throw e;
    }
    const p = el('div', undefined, 'plot');
    plot(p, samples, [
      { values: samples.map((s) => [s.t_ms, s.rate, s.source === 'transfer']), cls: 'rate' },
      { values: samples.map((s) => [s.t_ms, s.rtt_ms]), cls: 'rtt', right: true },
    ], perSecond, 'ms');
    div.append(p);
    return div;
  }));
  box.replaceChildren(...parts);
}

async function refresh() {
  clearTimeout(timer);
  if (!token()) return;
  try {
    const jobs = await api('/api/jobs?limit=50');
    $('jobs').tBodies[0].replaceChildren(...jobs.map(jobRow));
    await drawRates();
    if (Date.now() - linksAt >= LINKS_EVERY_MS) {
      linksAt = Date.now();
      await drawLinks();
    }
    status('updated ' + new Date().toLocaleTimeString());
  } catch (e) {
    status(e.message, true);
  }
  if (token()) timer = setTimeout(refresh, EVERY_MS);
}

function show(signedIn) {
  $('token-form').hidden = signedIn;
  $('main').hidden = !signedIn;
  $('forget').hidden = !signedIn;
}

function forget(why) {
  sessionStorage.removeItem(KEY);
  clearTimeout(timer);
  linksAt = 0;
  show(false);
  status(why || '', Boolean(why));
}

async function submitJob(ev) {
  ev.preventDefault();
  const msg = $('submit-msg');
  const job = {
    sources: $('sources').value.split('\n').map((s) => s.trim()).filter(Boolean),
    dest: $('dest').value.trim(),
    priority: parseInt($('priority').value, 10) || 0,
    label: $('label').value,
  };
  if ($('sync').value) job.sync = $('sync').value;
  try {
    const j = await api('/api/jobs', 'POST', JSON.stringify(job));
    msg.textContent = 'job ' + j.id + ' queued';
    msg.className = '';
    selected = j.id;
    $('selected-job').textContent = String(j.id);
    refresh();
  } catch (e) {
    msg.textContent = e.message;
    msg.className = 'error';
  }
}

async function onJobsClick(ev) {
  const cancel = ev.target.closest('button[data-cancel]');
  if (cancel) {
    try { await api('/api/jobs/' + cancel.dataset.cancel + '/cancel', 'POST'); } catch (e) { status(e.message, true); }
    refresh();
    return;
  }
  const row = ev.target.closest('tr[data-job]');
  if (!row) return;
  selected = Number(row.dataset.job);
  $('selected-job').textContent = String(selected);
  refresh();
}

document.addEventListener('DOMContentLoaded', () => {
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $('token').value.trim());
    $('token').value = '';
    show(true);
    refresh();
  });
  $('forget').addEventListener('click', () => forget());
  $('job-form').addEventListener('submit', submitJob);
  $('jobs').addEventListener('click', onJobsClick);
  show(Boolean(token()));
  refresh();
});
