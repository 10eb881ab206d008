// The escher dashboard: one page over the head's JSON API (`/api/...`), live through the watch
// API as server-sent events. Every text from the cluster goes into the page as text, never as
// markup. `escher dashboard` prints an address with a login ticket (`#ticket=...`), never a
// token: the page trades it once (`POST /api/login`) for a session that acts as the CLI's
// token, which stays in the head. The session (or a token typed into the form, or given as
// `#token=...`) stays in this tab's sessionStorage and travels in a header only; the ticket or
// token is taken out of the address bar and the tab's history, on load and whenever the
// address changes.
//
// The live feed is one per browser, not one per tab: a SharedWorker (`/events-worker.js`) holds
// it and passes each batch to every tab (a browser gives a host six connections, and a feed per
// tab would leave the seventh tab none). Where SharedWorker is missing, the tab reads a feed of
// its own.
'use strict';

const $ = (id) => document.getElementById(id);

/** An element: `h('td', {class: 'x', onclick: f}, 'text', child, ...)`. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'style') el.style.cssText = value;
    else el.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

const S = {
  token: sessionStorage.getItem('escher.token'),
  who: null,
  view: 'overview',
  selected: null,        // the task shown in detail
  revision: null,        // the last watch revision seen
  events: [],            // recent events, newest first
  logNode: null,         // the node whose tasks the log browser lists
  logTask: null,         // the task whose output it shows
  chartsAt: 0,           // when the charts were drawn last
  refreshing: false,
  again: false,
};
const MAX_EVENTS = 200;
const RECENT = 50;

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: 'Bearer ' + S.token } });
  let body;
  try { body = await response.json(); } catch { body = { message: response.statusText }; }
  if (!response.ok) throw new ApiError(response.status, body.code, body.message || response.statusText);
  return body;
}

// ---- formatting -------------------------------------------------------------------------

const num = (text) => (text === 'unbounded' ? Infinity : Number(text));
const fmtNum = (n) => (n === Infinity ? '∞' : Number.isInteger(n) ? String(n) : String(Number(n.toFixed(2))));
function ago(ms) {
  if (!ms) return '';
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${s.toFixed(0)}s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)}m ago`;
  return `${(s / 3600).toFixed(1)}h ago`;
}
function span(ms) {
  if (ms === null || ms === undefined) return '';
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}
const pad = (n) => String(n).padStart(2, '0');
/** The time of day of `ms` (local, 24 h), as the event list shows it. */
function clock(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
/** A serde `Duration` ({secs, nanos}) as text. */
const duration = (d) => (d ? span(d.secs * 1000 + Math.round((d.nanos || 0) / 1e6)) : '');
const badge = (text, cls) => h('span', { class: `state ${cls || text}` }, text);
const resources = (set) => Object.entries(set || {}).map(([k, v]) => `${k}=${v}`).join(', ');
const nodeName = (id) => (S.nodes && S.nodes.get(id)) || (id === null || id === undefined ? '' : `node ${id}`);

/** One resource as a row: name, a bar of used over total, and the figures. A capacity that
 *  shrank below what running tasks hold is drawn as a full warning bar, saying by how much. */
function bar(r) {
  const total = num(r.total);
  const used = num(r.used);
  const unbounded = total === Infinity;
  const over = !unbounded && used > total;
  const share = over ? 100 : unbounded || total === 0 ? 0 : Math.min(100, (100 * used) / total);
  const cls = ['bar', r.physical ? '' : 'ephemeral', unbounded ? 'unbounded' : '', over ? 'over' : ''].join(' ');
  const free = unbounded ? '∞' : fmtNum(Math.max(0, total - used));
  const figures = over
    ? `${fmtNum(used)} / ${fmtNum(total)} (over capacity by ${fmtNum(used - total)})`
    : `${fmtNum(used)} / ${fmtNum(total)} (${free} free)`;
  const title = over
    ? `${fmtNum(used)} held by running tasks, capacity now ${fmtNum(total)}: it shrank below what ` +
      'they hold; nothing new is placed here until they release it'
    : `${fmtNum(used)} used of ${fmtNum(total)}`;
  return h('div', { class: 'res' + (over ? ' over' : ''), 'data-resource': r.name },
    h('span', { class: 'name', title: r.name }, r.name),
    h('div', { class: cls, title }, h('div', { style: `width:${share}%` })),
    h('span', { class: 'num', title }, figures));
}

function table(el, head, rows) {
  el.replaceChildren(
    h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))),
    h('tbody', {}, rows));
}

// ---- views --------------------------------------------------------------------------------

async function renderOverview() {
  const status = await api('/api/status');
  S.nodes = new Map(status.nodes.map((n) => [n.id, n.name]));
  const alive = status.nodes.filter((n) => n.alive).length;
  const card = (n, label) => h('div', { class: 'card' }, h('div', { class: 'n' }, n), h('div', { class: 'label' }, label));
  $('summary').replaceChildren(
    card(alive, 'live nodes'),
    card(status.nodes.length - alive, 'lost nodes'),
    card(status.running_tasks, 'running'),
    card(status.pending_tasks, 'pending'));
  table($('namespaces'), ['namespace', 'pending', 'running', 'succeeded', 'failed', 'cancelled'],
    status.namespaces.map((c) => h('tr', { 'data-namespace': c.namespace || '' },
      h('td', {}, c.namespace || '(none)'), h('td', {}, c.pending), h('td', {}, c.running),
      h('td', {}, c.succeeded), h('td', {}, c.failed), h('td', {}, c.cancelled))));
  $('nodes').replaceChildren(...status.nodes.map(renderNode));
  renderEvents();
  // The charts change with the head's samples (every few seconds), not with each event: drawn
  // here when stale, and by their own timer (see start).
  if (Date.now() - S.chartsAt > 4000) await renderCharts();
}

// ---- utilisation over time --------------------------------------------------------------

const CHART_W = 320;
const CHART_H = 90;

/** An inline SVG chart of `series` ([{key, label, cls, values}]) over the samples' times. */
function chart(name, title, samples, series) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = (tag, attrs) => {
    const el = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    return el;
  };
  const times = samples.map((s) => s.at_ms);
  const t0 = times[0];
  const t1 = times[times.length - 1];
  const top = Math.max(1, ...series.flatMap((s) => s.values));
  const x = (t) => (t1 === t0 ? CHART_W : ((t - t0) / (t1 - t0)) * CHART_W);
  const y = (v) => CHART_H - (v / top) * (CHART_H - 4);
  const root = svg('svg', {
    viewBox: `0 0 ${CHART_W} ${CHART_H}`, width: CHART_W, height: CHART_H,
    class: 'chart', 'data-chart': name, role: 'img', 'aria-label': title,
  });
  for (const frac of [0.5, 1]) {
    root.append(svg('line', { x1: 0, x2: CHART_W, y1: y(top * frac), y2: y(top * frac), class: 'grid' }));
  }
  for (const s of series) {
    const points = s.values.map((v, i) => `${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    if (s.area && s.values.length) {
      root.append(svg('polygon', {
        points: `${x(t0).toFixed(1)},${CHART_H} ${points} ${x(t1).toFixed(1)},${CHART_H}`,
        class: `area ${s.cls}`,
      }));
    }
    root.append(svg('polyline', { points, class: `line ${s.cls}`, 'data-series': s.key }));
  }
  const last = (s) => fmtNum(s.values.length ? s.values[s.values.length - 1] : 0);
  const legend = h('div', { class: 'legend' }, series.map((s) =>
    h('span', { class: `key ${s.cls}` }, `${s.label} ${last(s)}`)));
  return h('figure', { class: 'chart-box' }, h('figcaption', {}, title), root, legend);
}

/** CPU, memory and GPU used against total, and tasks running and pending, from the head's
 *  history (`/api/history`: a sample every few seconds, the last hour). */
async function renderCharts() {
  const box = $('charts');
  S.chartsAt = Date.now();
  const reply = await api('/api/history');
  const samples = reply.samples;
  if (samples.length < 2) {
    box.replaceChildren(h('p', { class: 'note' }, 'collecting: the head samples the cluster every ' +
      `${reply.interval_ms / 1000} s`));
    return;
  }
  const pick = (key) => samples.map((s) => s[key]);
  const used = (key) => [
    { key: 'total', label: 'total', cls: 'total', values: pick(`${key}_total`) },
    { key: 'used', label: 'used', cls: 'used', values: pick(`${key}_used`), area: true },
  ];
  const minutes = (samples[samples.length - 1].at_ms - samples[0].at_ms) / 60000;
  const charts = [
    chart('cpu', 'CPU (cores)', samples, used('cpu')),
    chart('memory', 'memory (MiB)', samples, used('memory')),
  ];
  if (samples.some((s) => s.gpu_total > 0)) charts.push(chart('gpu', 'GPUs (whole or fractional; MIG in the GPU view)', samples, used('gpu')));
  charts.push(chart('tasks', 'tasks', samples, [
    { key: 'running', label: 'running', cls: 'used', values: pick('running'), area: true },
    { key: 'pending', label: 'pending', cls: 'pending', values: pick('pending') },
  ]));
  box.replaceChildren(...charts, h('p', { class: 'note span' },
    `the last ${minutes < 1 ? `${Math.round(minutes * 60)} s` : `${minutes.toFixed(1)} min`}, a sample every ` +
    `${reply.interval_ms / 1000} s (the head keeps ${Math.round((reply.capacity * reply.interval_ms) / 60000)} min)`));
}

function renderNode(n) {
  const labels = Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join('  ');
  // Devices by UUID (whole GPUs, MIG slices) are drawn in the GPU view; here the counts stand
  // for them.
  const shown = n.resources.filter((r) => !r.name.startsWith('mig.MIG-') && !r.name.startsWith('gpu.GPU-'));
  const physical = shown.filter((r) => r.physical);
  const ephemeral = shown.filter((r) => !r.physical);
  const state = n.alive ? 'alive' : 'dead';
  // The worker says whether it runs each namespace's tasks as a user of their own.
  const shared = (n.labels || {})['escher.isolation'] === 'none';
  return h('div', { class: `node ${state}`, 'data-node': n.name },
    h('h3', {}, n.name, h('span', { class: 'note' }, `node ${n.id}`), badge(state),
      shared ? badge('not isolated', 'shared') : '',
      n.alive ? '' : h('span', { class: 'note' }, `${n.left_because || ''} ${ago(n.left_at_ms)}`)),
    shared ? h('div', { class: 'isolation' }, 'tasks on this node share one user: tenants here ' +
      'are not isolated (run escher-worker as root for a user per namespace)') : '',
    labels ? h('div', { class: 'labels' }, labels) : '',
    physical.length ? h('h4', {}, 'physical') : '', physical.map(bar),
    ephemeral.length ? h('h4', {}, 'ephemeral and custom') : '', ephemeral.map(bar),
    h('a', { class: 'node-logs', href: `#logs/${n.id}` }, 'tasks and logs →'));
}

/** The recent events, newest first, each with the time the head committed it (`at_ms`, from
 *  the watch API itself). */
function renderEvents() {
  $('events').replaceChildren(...S.events.slice(0, 50).map((e) =>
    h('li', { 'data-kind': e.kind },
      e.at_ms ? h('time', { class: 'at', datetime: new Date(e.at_ms).toISOString(), title: new Date(e.at_ms).toLocaleString() }, clock(e.at_ms)) : '',
      h('span', { class: 'rev' }, `#${e.revision}`), e.text)));
}

function taskQuery() {
  const form = new FormData($('filters'));
  const params = new URLSearchParams();
  for (const [k, v] of form.entries()) if (String(v).trim()) params.set(k, String(v).trim());
  return params.toString();
}

async function renderTasks() {
  if (!S.who.sees_tasks) {
    $('tasks-note').textContent = `${S.who.caller} sees no task: tasks need an app token (its ` +
      'namespace) or an admin token, as in the CLI.';
    $('tasks').replaceChildren();
    return;
  }
  const reply = await api('/api/tasks?' + taskQuery());
  await ensureNodes();
  $('tasks-note').textContent = `${reply.tasks.length} task(s), newest first` +
    (reply.more ? `; ${reply.more} more match (narrow the filters)` : '');
  table($('tasks'), ['id', 'name', 'namespace', 'state', 'node', 'attempt', 'submitted', 'ran', 'why'],
    reply.tasks.map((t) => h('tr', {
      class: 'clickable' + (S.selected === t.id ? ' selected' : ''), 'data-task': t.id,
      onclick: () => { location.hash = `#tasks/${t.id}`; },
    },
    h('td', {}, t.id), h('td', {}, t.name), h('td', {}, t.namespace || ''),
    h('td', {}, badge(t.state)), h('td', {}, t.node === null ? '' : nodeName(t.node)),
    h('td', {}, t.attempt || ''), h('td', {}, ago(t.submitted_at_ms)),
    h('td', {}, t.started_at_ms ? span((t.finished_at_ms || Date.now()) - t.started_at_ms) : ''),
    h('td', { class: 'reason' }, t.reason || ''))));
  if (S.selected !== null) await renderTaskDetail(S.selected);
  else closePanel($('task-detail'));
}

/** Shows `panel` (a side panel: fixed beside the list, wherever the list is scrolled to). */
function openPanel(panel, ...children) {
  panel.hidden = false;
  panel.parentElement.classList.add('with-panel');
  panel.replaceChildren(...children);
}

function closePanel(panel) {
  panel.hidden = true;
  panel.parentElement.classList.remove('with-panel');
}

/** The button that closes a panel by going to `hash`. */
const closer = (hash) => h('button', {
  class: 'close', title: 'close (Esc)', 'aria-label': 'close',
  onclick: () => { location.hash = hash; },
}, '×');

async function ensureNodes() {
  if (S.nodes) return;
  const status = await api('/api/status');
  S.nodes = new Map(status.nodes.map((n) => [n.id, n.name]));
}

function describeKind(kind) {
  if (!kind || typeof kind !== 'object') return String(kind);
  const [name, body] = Object.entries(kind)[0];
  if (name === 'Command') return ['command', body.argv.join(' ')];
  if (name === 'Function') return ['function', body.name || JSON.stringify(body).slice(0, 120)];
  return [name.toLowerCase(), JSON.stringify(body).slice(0, 200)];
}

function describeResult(result) {
  if (!result) return '';
  if (typeof result !== 'object') return String(result);
  const [name, body] = Object.entries(result)[0];
  return `${name}${body && typeof body === 'object' ? ' ' + Object.entries(body).map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`).join(', ') : ''}`;
}

/** Why a pending task waits, as rows: the head's sentence, the resource it is short of, how
 *  much it asks and the most any live node has, the nodes closest to fitting, and for how long
 *  it may wait. */
function pendingRows(info) {
  if (info.status.state !== 'Pending') return [];
  const p = info.pending_reason;
  const rows = [];
  if (p) {
    rows.push(['waits for', h('span', { class: 'waits' }, p.message)]);
    rows.push(['short of', `${p.resource}: asks ${p.requested}`]);
    rows.push(['most on a live node', p.best_total === null || p.best_total === undefined
      ? `no live node has ${p.resource}` : `${p.resource}=${p.best_total}`]);
    rows.push(['closest nodes', p.closest_nodes.length ? p.closest_nodes.map(nodeName).join(', ') : 'none']);
  } else {
    rows.push(['waits for', h('span', { class: 'waits' }, info.status.reason ||
      'room on a node: the cluster could run it, and it runs when running tasks release enough')]);
  }
  rows.push(['waiting', span(Date.now() - info.submitted_at_ms)]);
  if (info.spec.pending_deadline) rows.push(['gives up after', duration(info.spec.pending_deadline)]);
  return rows;
}

async function renderTaskDetail(id) {
  const detail = $('task-detail');
  let info;
  try {
    info = await api(`/api/tasks/${id}`);
  } catch (err) {
    openPanel(detail, closer('#tasks'), h('p', { class: 'error' }, `task ${id}: ${err.message}`));
    return;
  }
  const [kind, what] = describeKind(info.spec.kind);
  const pending = pendingRows(info);
  const labels = Object.entries(info.spec.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
  const rows = [
    ['state', badge(info.status.state)],
    ['name', info.spec.name],
    [kind, h('code', {}, what)],
    ['requires', resources(info.spec.resources) || 'nothing'],
    labels ? ['labels', labels] : null,
    info.status.node !== null ? ['node', nodeName(info.status.node)] : null,
    info.status.reason && !pending.length ? ['why', info.status.reason] : null,
    ...pending,
    info.status.result ? ['result', describeResult(info.status.result)] : null,
    ['submitted', new Date(info.submitted_at_ms).toLocaleString()],
    info.spec.timeout ? ['time limit', duration(info.spec.timeout)] : null,
    info.spec.max_retries ? ['retries allowed', info.spec.max_retries] : null,
  ].filter(Boolean);
  const attempts = !info.attempts.length ? h('p', { class: 'note' }, 'none yet') : h('table', { class: 'attempts' },
    h('thead', {}, h('tr', {}, ['attempt', 'node', 'started', 'ended'].map((c) => h('th', {}, c)))),
    h('tbody', {}, info.attempts.map((a) => h('tr', {},
      h('td', {}, a.attempt), h('td', {}, nodeName(a.node)),
      h('td', {}, new Date(a.started_at_ms).toLocaleTimeString()), h('td', {}, a.ended || 'running')))));
  const logs = h('div', { id: 'task-logs' }, h('p', { class: 'note' }, 'reading the output…'));
  const telemetry = h('div', { id: 'task-telemetry' });
  openPanel(detail, closer('#tasks'),
    h('h3', {}, `task ${info.status.id}`),
    h('dl', {}, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
    h('h4', {}, 'attempts'), attempts,
    h('h4', {}, 'telemetry'), telemetry,
    h('h4', {}, 'output (tail)'), logs);
  renderTelemetry(id, telemetry);
  await renderLogs(id, info.attempts.length, logs);
}

/** The tail of a task's stdout and stderr into `box` (`/api/tasks/ID/logs`, which reads them
 *  from the worker, or from the head when it kept them). */
async function renderLogs(id, attempts, box) {
  if (!attempts) {
    box.replaceChildren(h('p', { class: 'note' }, 'no attempt yet: no output'));
    return;
  }
  try {
    const tail = await api(`/api/tasks/${id}/logs`);
    const stream = (name, t) => [
      h('div', { class: 'note' }, name, t.truncated ? ' (last 64 KiB)' : '', t.notice ? ` — ${t.notice}` : ''),
      t.error ? h('p', { class: 'error' }, t.error) : h('pre', { 'data-stream': name }, t.text || '(empty)')];
    box.replaceChildren(...stream('stdout', tail.stdout), ...stream('stderr', tail.stderr));
  } catch (err) {
    box.replaceChildren(h('p', { class: 'error' }, err.message));
  }
}

// ---- the log browser: a node's tasks and their output -------------------------------------

async function renderLogBrowser() {
  const status = await api('/api/status');
  S.nodes = new Map(status.nodes.map((n) => [n.id, n.name]));
  if (S.logNode === null && status.nodes.length) S.logNode = status.nodes[0].id;
  $('log-nodes').replaceChildren(...status.nodes.map((n) => h('a', {
    href: `#logs/${n.id}`, 'data-log-node': n.id,
    class: 'node-pick' + (n.id === S.logNode ? ' active' : '') + (n.alive ? '' : ' dead'),
  }, n.name, h('span', { class: 'note' }, ` node ${n.id}`))));
  const panel = $('log-detail');
  if (!S.who.sees_tasks) {
    $('log-note').textContent = `${S.who.caller} sees no task, so no output: use an app or admin token.`;
    $('log-tasks').replaceChildren();
    closePanel(panel);
    return;
  }
  if (S.logNode === null) {
    $('log-note').textContent = 'no node yet';
    $('log-tasks').replaceChildren();
    return;
  }
  const reply = await api(`/api/tasks?node=${S.logNode}`);
  $('log-note').textContent = `${reply.tasks.length} task(s) whose latest attempt ran on ` +
    `${nodeName(S.logNode)}, newest first` + (reply.more ? `; ${reply.more} more` : '') +
    '; pick one for its stdout and stderr';
  table($('log-tasks'), ['id', 'name', 'state', 'attempt', 'started', 'ran'],
    reply.tasks.map((t) => h('tr', {
      class: 'clickable' + (S.logTask === t.id ? ' selected' : ''), 'data-task': t.id,
      onclick: () => { location.hash = `#logs/${S.logNode}/${t.id}`; },
    },
    h('td', {}, t.id), h('td', {}, t.name), h('td', {}, badge(t.state)), h('td', {}, t.attempt || ''),
    h('td', {}, ago(t.started_at_ms)),
    h('td', {}, t.started_at_ms ? span((t.finished_at_ms || Date.now()) - t.started_at_ms) : ''))));
  if (S.logTask === null) { closePanel(panel); return; }
  const shown = reply.tasks.find((t) => t.id === S.logTask);
  const logs = h('div', { class: 'log-streams' }, h('p', { class: 'note' }, 'reading the output…'));
  openPanel(panel, closer(`#logs/${S.logNode}`),
    h('h3', {}, `task ${S.logTask}`, shown && shown.name ? ` (${shown.name})` : '', ' on ', nodeName(S.logNode)),
    h('p', {}, h('a', { href: `#tasks/${S.logTask}` }, 'the task\'s detail →')),
    logs);
  await renderLogs(S.logTask, shown ? shown.attempt : 1, logs);
}

// What the task reported of its progress (`ctx.report`, `escher report`): per key, the latest
// value, how many samples, their range.
async function renderTelemetry(id, box) {
  try {
    const reported = await api(`/api/tasks/${id}/telemetry`);
    if (!reported.length) {
      box.replaceChildren(h('p', { class: 'note' }, 'none reported'));
      return;
    }
    const t = reported[0];
    const keys = [...new Set(t.samples.map((s) => s.key))];
    const row = (key) => {
      const values = t.samples.filter((s) => s.key === key).map((s) => s.value);
      return h('tr', { 'data-key': key },
        h('td', {}, key), h('td', { class: 'latest' }, String(values[values.length - 1])),
        h('td', {}, values.length), h('td', {}, `${Math.min(...values)} – ${Math.max(...values)}`));
    };
    box.replaceChildren(
      h('p', { class: 'note' }, `attempt ${t.attempt}`),
      h('table', { class: 'telemetry' },
        h('thead', {}, h('tr', {}, ['key', 'latest', 'samples', 'range'].map((c) => h('th', {}, c)))),
        h('tbody', {}, keys.map(row))));
  } catch (err) {
    box.replaceChildren(h('p', { class: 'error' }, err.message));
  }
}

async function renderReservations() {
  const box = $('reservations');
  if (!S.who.sees_tasks) {
    box.replaceChildren(h('p', { class: 'note' }, `${S.who.caller} sees no task, so no reservation holder; use an app or admin token.`));
    return;
  }
  const reservations = await api('/api/reservations');
  await ensureNodes();
  if (!reservations.length) {
    box.replaceChildren(h('p', { class: 'note' }, 'no reservation now'));
    return;
  }
  box.replaceChildren(...reservations.map(({ name, holders }) => {
    const placed = holders.every((t) => t.state === 'Running');
    const released = holders.every((t) => ['Succeeded', 'Failed', 'Cancelled'].includes(t.state));
    const state = released ? 'released' : placed ? 'placed' : 'waiting';
    return h('div', { class: 'reservation', 'data-reservation': name },
      h('h3', {}, name, ' ', badge(state, { placed: 'Running', waiting: 'Pending', released: 'Cancelled' }[state])),
      h('table', {}, h('thead', {}, h('tr', {}, ['bundle', 'holder', 'state', 'node', 'resources', 'why'].map((c) => h('th', {}, c)))),
        h('tbody', {}, holders.map((t, i) => h('tr', { class: 'clickable', onclick: () => { location.hash = `#tasks/${t.id}`; } },
          h('td', {}, i), h('td', {}, t.id), h('td', {}, badge(t.state)),
          h('td', {}, t.node === null ? '' : nodeName(t.node)), h('td', {}, resources(t.resources)),
          h('td', {}, t.reason || ''))))));
  }));
}

async function renderActors() {
  const box = $('actors');
  if (!S.who.sees_tasks) {
    box.replaceChildren(h('caption', {}, `${S.who.caller} sees no task, so no actor; use an app or admin token.`));
    return;
  }
  const actors = await api('/api/actors');
  await ensureNodes();
  if (!actors.length) {
    box.replaceChildren(h('caption', {}, 'no actor'));
    return;
  }
  // Each actor's output is its task's: the detail lists its incarnations (attempts) and
  // shows the output of the latest; the log browser has it under its node.
  table(box, ['actor', 'name', 'class', 'state', 'node', 'incarnation', 'restarts', 'pending calls', 'resources', 'why', 'logs'],
    actors.map((a) => {
      const t = a.task;
      const logs = t.node === null ? '' : h('a', { class: 'actor-logs', href: `#logs/${t.node}/${t.id}` }, 'logs →');
      return h('tr', { 'data-actor': t.id },
        h('td', {}, h('a', { href: `#tasks/${t.id}` }, t.id)), h('td', {}, a.actor_name || ''),
        h('td', { 'data-col': 'class' }, a.class), h('td', { 'data-col': 'state' }, badge(t.state)),
        h('td', { 'data-col': 'node' }, t.node === null ? '' : nodeName(t.node)),
        h('td', { 'data-col': 'incarnation' }, a.incarnation), h('td', { 'data-col': 'restarts' }, a.restarts),
        h('td', { 'data-col': 'pending' }, a.pending_calls === null ? '' : a.pending_calls),
        h('td', { 'data-col': 'resources' }, resources(t.resources)),
        // A live actor's reason is its last restart's, which its restarts column tells.
        h('td', { 'data-col': 'why' }, t.state === 'Running' ? '' : t.reason || ''),
        h('td', {}, logs));
    }));
}

async function renderGpus() {
  const reply = await api('/api/gpus');
  const box = $('gpus');
  if (!reply.nodes.length) {
    box.replaceChildren(h('p', { class: 'note' }, 'no node reports a GPU'));
    return;
  }
  box.replaceChildren(...reply.nodes.flatMap((node) => node.gpus.map((g) => renderGpu(node, g))));
}

function renderGpu(node, g) {
  const info = g.info;
  const slots = info.memory_slices || 8;
  // Per device: its holders' tasks and how much of it they hold together (a task may hold a
  // fraction: gpu=0.5).
  const held = new Map();
  const share = new Map();
  for (const d of g.holders) {
    if (!held.has(d.uuid)) held.set(d.uuid, []);
    held.get(d.uuid).push(Number(d.amount) < 1 ? `${d.task} (${d.amount})` : d.task);
    share.set(d.uuid, (share.get(d.uuid) || 0) + Number(d.amount || 1));
  }
  // A device's drawing: busy when held whole, partly filled when fractions of it are held.
  const occupancy = (uuid) => {
    const used = share.get(uuid) || 0;
    return {
      used,
      cls: used >= 1 ? 'busy' : used > 0 ? 'partial' : 'idle',
      fill: used > 0 && used < 1 ? h('div', { class: 'fill', style: `width:${Math.round(used * 100)}%` }) : '',
      text: used > 0 && used < 1 ? `${fmtNum(used)} of 1 held` : '',
    };
  };
  const retiring = new Set(g.reconfiguring ? g.reconfiguring.retiring : []);
  const title = `${node.name} · GPU ${info.index} · ${info.product} · ${(info.memory_mib / 1024).toFixed(0)} GiB` +
    (info.simulated ? ' · simulated' : '');
  let drawing;
  if (info.mig_enabled) {
    const used = new Set();
    const cells = info.slices.map((s) => {
      for (let i = s.start; i < s.start + s.size; i++) used.add(i);
      const tasks = held.get(s.uuid) || [];
      const o = occupancy(s.uuid);
      const cls = retiring.has(s.uuid) ? 'retiring' : o.cls;
      return h('div', {
        class: `slot ${cls}`, 'data-profile': s.profile, 'data-uuid': s.uuid, 'data-used': fmtNum(o.used),
        style: `grid-column: ${s.start + 1} / span ${s.size}`,
        title: `${s.profile} at slot ${s.start} · ${s.uuid}` + (tasks.length ? ` · task ${tasks.join(', ')}` : ' · idle'),
      }, o.fill, h('b', {}, s.profile), h('br'),
      h('span', {}, tasks.length ? `task ${tasks.join(', ')}` : retiring.has(s.uuid) ? 'retiring' : 'idle'),
      o.text ? h('span', { class: 'share' }, ` · ${o.text}`) : '');
    });
    for (let i = 0; i < slots; i++) {
      if (!used.has(i)) cells.push(h('div', { class: 'slot free', style: `grid-column: ${i + 1} / span 1` }, 'free'));
    }
    drawing = [
      h('div', { class: 'slots', style: `grid-template-columns: repeat(${slots}, 1fr)` }, cells),
      h('div', { class: 'scale', style: `grid-template-columns: repeat(${slots}, 1fr)` },
        [...Array(slots).keys()].map((i) => h('span', {}, `slot ${i}`))),
    ];
  } else {
    const tasks = held.get(info.uuid) || [];
    const o = occupancy(info.uuid);
    drawing = h('div', { class: 'slots', style: 'grid-template-columns: 1fr' },
      h('div', { class: `slot ${o.cls}`, 'data-uuid': info.uuid, 'data-used': fmtNum(o.used) },
        o.fill, h('b', {}, 'whole GPU (MIG off)'), h('br'),
        h('span', {}, tasks.length ? `task ${tasks.join(', ')}` : 'idle'),
        o.text ? h('span', { class: 'share' }, ` · ${o.text}`) : ''));
  }
  return h('div', { class: 'gpu', 'data-gpu': `${node.name}/${info.index}` },
    h('h3', {}, title, ' ', node.alive ? '' : badge('dead')),
    drawing,
    g.reconfiguring ? h('p', { class: 'note' }, `reconfiguring to ${g.reconfiguring.target}` +
      (g.reconfiguring.waiting_for.length ? `, waiting for task(s) ${g.reconfiguring.waiting_for.join(', ')}` : '')) : '',
    g.last_error ? h('p', { class: 'error' }, `last reconfiguration failed: ${g.last_error}`) : '');
}

async function renderHeads() {
  const reply = await api('/api/heads');
  table($('heads'), ['replica', 'address', 'role', 'term', 'commit', 'applied', 'leader', 'storage', 'note'],
    reply.replicas.map((r) => h('tr', { 'data-replica': r.id },
      h('td', {}, r.id), h('td', {}, r.address),
      h('td', {}, r.reachable ? badge(r.role || 'unknown') : badge('unreachable')),
      h('td', {}, r.term), h('td', {}, r.commit_index), h('td', {}, r.applied_index),
      h('td', {}, r.leader || ''), h('td', {}, r.in_memory ? 'in memory' : 'on disk'),
      h('td', { class: 'error' }, r.error || ''))));
}

/** One table per policy report: a row per tenant, a column per measure. */
async function renderPolicies() {
  const reports = await api('/api/policies');
  const box = $('policies');
  if (!reports.length) {
    box.replaceChildren(h('p', { class: 'note', id: 'policies-none' },
      'No policy has reported yet (an ESL reports with ClusterApi::report_policy; fair-time does after each round).'));
    return;
  }
  box.replaceChildren(...reports.map((r) => {
    const measures = [...new Set(r.rows.flatMap((row) => Object.keys(row.measures)))].sort();
    const t = h('table', { class: 'policy' });
    table(t, ['tenant', ...measures], r.rows.map((row) => h('tr', { 'data-row': row.row },
      h('td', {}, row.row),
      measures.map((m) => h('td', { 'data-measure': m }, m in row.measures ? fmtNum(row.measures[m]) : '')))));
    return h('div', { class: 'policy-report', 'data-policy': r.policy, 'data-namespace': r.namespace || '' },
      h('h3', {}, r.policy, r.namespace ? ` · namespace ${r.namespace}` : '',
        h('span', { class: 'note' }, ` · reported ${ago(r.reported_at_ms)}`)),
      t);
  }));
}

const VIEWS = {
  overview: renderOverview,
  tasks: renderTasks,
  actors: renderActors,
  reservations: renderReservations,
  gpus: renderGpus,
  heads: renderHeads,
  policies: renderPolicies,
  logs: renderLogBrowser,
};

/** Draws the current view from fresh data; calls that arrive meanwhile run once after it. */
async function refresh() {
  if (S.refreshing) { S.again = true; return; }
  S.refreshing = true;
  try {
    do {
      S.again = false;
      try {
        await VIEWS[S.view]();
        $('banner').hidden = true;
      } catch (err) {
        if (err.status === 401) { signOut(err.message); return; }
        $('banner').hidden = false;
        $('banner').textContent = err.message;
      }
    } while (S.again);
  } finally {
    S.refreshing = false;
  }
}

let refreshTimer = null;
/** A refresh soon, at most one per quarter second however many events arrive. */
function refreshSoon() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, 250);
}

function route() {
  const [view, id, sub] = (location.hash.slice(1) || 'overview').split('/');
  S.view = VIEWS[view] ? view : 'overview';
  S.selected = S.view === 'tasks' && id ? Number(id) : null;
  if (S.view === 'logs') {
    S.logNode = id ? Number(id) : S.logNode;
    S.logTask = sub ? Number(sub) : null;
  }
  for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('active', a.dataset.view === S.view);
  for (const name of Object.keys(VIEWS)) $(`view-${name}`).hidden = name !== S.view;
  refresh();
}

// ---- live updates -------------------------------------------------------------------------

function setLive(on, why) {
  const el = $('live');
  el.className = `live ${on ? 'on' : 'off'}`;
  el.textContent = on ? 'live' : 'not live';
  el.title = why || (on ? `watching from revision ${S.revision}` : '');
}

function onBatch(batch) {
  S.revision = batch.revision;
  if (!batch.events.length) return;
  for (const e of batch.events) S.events.unshift(e);
  S.events.length = Math.min(S.events.length, MAX_EVENTS);
  if (batch.events.some((e) => e.kind === 'node')) S.nodes = null;
  refreshSoon();
}

/** The feed this tab reads: through the browser's shared worker (`port`), or its own
 *  (`abort` stops it); `generation` ends a feed of its own that a newer one replaced. */
const Live = { port: null, abort: null, generation: 0 };

/** Starts reading the live feed for `S.token`, replacing any feed this tab read before. */
function live() {
  stopLive();
  if (typeof SharedWorker === 'function') {
    try {
      liveShared();
      return;
    } catch (err) {
      console.warn('no shared live feed, reading one for this tab:', err);
    }
  }
  liveOwn();
}

function stopLive() {
  Live.generation += 1;
  if (Live.port) {
    try { Live.port.postMessage({ type: 'stop' }); } catch { /* gone */ }
    Live.port.close();
    Live.port = null;
  }
  if (Live.abort) { Live.abort.abort(); Live.abort = null; }
}

/** The feed the browser's tabs share (see events-worker.js). */
function liveShared() {
  const worker = new SharedWorker('/events-worker.js', { name: 'escher-live' });
  const port = worker.port;
  Live.port = port;
  $('live').dataset.feed = 'shared';
  worker.addEventListener('error', () => {
    // The worker could not start: this tab reads a feed of its own.
    if (Live.port !== port) return;
    Live.port = null;
    liveOwn();
  });
  port.addEventListener('message', (m) => {
    if (Live.port !== port) return;
    const message = m.data || {};
    if (message.type === 'recent') {
      S.revision = message.revision;
      S.events = message.events.slice(0, MAX_EVENTS);
      refreshSoon();
    } else if (message.type === 'batch') {
      onBatch(message.batch);
    } else if (message.type === 'live') {
      setLive(message.on, message.why);
    } else if (message.type === 'resync') {
      S.revision = null;
      refreshSoon();
    }
  });
  port.start();
  port.postMessage({ type: 'watch', token: S.token });
}

/** A feed of this tab's own, where there is no SharedWorker. */
async function liveOwn() {
  const generation = ++Live.generation;
  $('live').dataset.feed = 'tab';
  while (S.token && Live.generation === generation) {
    const abort = new AbortController();
    Live.abort = abort;
    try {
      // The first time, the last events too, so the overview starts with some history.
      const after = S.revision === null ? `?recent=${RECENT}` : `?after=${S.revision}`;
      const response = await fetch('/api/events' + after, {
        headers: { Authorization: 'Bearer ' + S.token }, signal: abort.signal,
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        if (body.code === 'OutOfRange') { S.revision = null; refreshSoon(); continue; }
        throw new Error(body.message || response.statusText);
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let event = 'message';
          const data = [];
          for (const line of frame.split('\n')) {
            if (line.startsWith('event:')) event = line.slice(6).trim();
            else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
          }
          if (event === 'batch') { onBatch(JSON.parse(data.join('\n'))); setLive(true); }
          else if (event === 'end') {
            const why = data.join('\n');
            if (why.startsWith('OutOfRange')) S.revision = null;
            setLive(false, why);
          }
        }
      }
    } catch (err) {
      if (abort.signal.aborted) return;
      setLive(false, err.message);
    }
    if (Live.generation !== generation) return;
    setLive(false, 'reconnecting');
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// ---- signing in ---------------------------------------------------------------------------

/** Moves a token given in the address (`#token=T&view=V`, as `escher dashboard` prints it)
 *  into this tab's storage, and replaces the address, in the bar and in the tab's history,
 *  with the view alone. Returns the token, or null when the address carries none. */
function takeToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get('token');
  if (given === null) return null;
  const view = fragment.get('view') || 'overview';
  history.replaceState(null, '', location.pathname + location.search + '#' + view);
  const token = given.trim();
  if (token) sessionStorage.setItem('escher.token', token);
  return token || null;
}

/** Takes a login ticket given in the address (`#ticket=T&view=V`, as `escher dashboard`
 *  prints it) out of the address, in the bar and in the tab's history, leaving the view.
 *  Returns the ticket, or null when the address carries none. */
function takeTicket() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get('ticket');
  if (given === null) return null;
  const view = fragment.get('view') || 'overview';
  history.replaceState(null, '', location.pathname + location.search + '#' + view);
  return given.trim() || null;
}

/** Trades a ticket for a session (once: a used or expired ticket is refused) and signs in. */
async function redeem(ticket) {
  let session;
  try {
    const response = await fetch('/api/login', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ticket }),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.message || response.statusText);
    session = body.session;
  } catch (err) {
    signOut(`the login ticket was refused: ${err.message}`);
    return;
  }
  stopLive();
  S.revision = null;
  S.events = [];
  S.nodes = null;
  await signIn(session);
}

async function signIn(token) {
  S.token = token;
  try {
    S.who = await api('/api/whoami');
  } catch (err) {
    signOut(err.message);
    return;
  }
  if (S.token !== token) return;  // another sign-in began meanwhile
  sessionStorage.setItem('escher.token', token);
  $('who').textContent = S.who.caller;
  $('sign-in').hidden = true;
  $('main').hidden = false;
  $('sign-out').hidden = false;
  route();
  live();
}

function signOut(why) {
  stopLive();
  S.chartsAt = 0;
  S.token = null;
  S.who = null;
  S.revision = null;
  S.events = [];
  S.nodes = null;
  sessionStorage.removeItem('escher.token');
  $('main').hidden = true;
  $('sign-out').hidden = true;
  $('who').textContent = '';
  $('sign-in').hidden = false;
  $('sign-in-error').textContent = why || '';
  setLive(false);
}

/** A new address: a token in it signs this tab in with it (and leaves the address at once);
 *  otherwise it names a view. */
function onAddress() {
  const ticket = takeTicket();
  if (ticket) {
    redeem(ticket);
    return;
  }
  const given = takeToken();
  if (given && given !== S.token) {
    stopLive();
    S.revision = null;
    S.events = [];
    S.nodes = null;
    signIn(given);
  } else if (S.token) {
    route();
  }
}

function start() {
  const ticket = takeTicket();
  const given = takeToken();
  if (given) S.token = given;
  $('sign-in-form').addEventListener('submit', (e) => {
    e.preventDefault();
    signIn($('token').value.trim());
  });
  $('sign-out').addEventListener('click', () => signOut());
  $('filters').addEventListener('submit', (e) => { e.preventDefault(); refresh(); });
  $('filters').addEventListener('reset', () => setTimeout(refresh, 0));
  window.addEventListener('hashchange', onAddress);
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return;
    if (S.view === 'tasks' && S.selected !== null) location.hash = '#tasks';
    else if (S.view === 'logs' && S.logTask !== null) location.hash = `#logs/${S.logNode}`;
  });
  // A closing tab leaves the shared feed (the last one to leave ends it); one restored from
  // the back-forward cache joins it again.
  window.addEventListener('pagehide', stopLive);
  window.addEventListener('pageshow', (e) => { if (e.persisted && S.token && S.who) live(); });
  // The side panels start below the header, however tall it wraps.
  const headerHeight = () => document.documentElement.style.setProperty(
    '--header', `${document.querySelector('header').offsetHeight}px`);
  headerHeight();
  window.addEventListener('resize', headerHeight);
  setInterval(() => { if (S.token && (S.view === 'heads' || S.view === 'policies')) refresh(); }, 3000);
  // The charts follow the head's samples even when no event arrives.
  setInterval(() => { if (S.token && S.who && S.view === 'overview' && !document.hidden) renderCharts().catch(() => {}); }, 5000);
  if (ticket) redeem(ticket);
  else if (S.token) signIn(S.token);
  else signOut();
}

start();
