// The escher dashboard: one page over the head's JSON API (`/api/...`), live through the watch
// API as server-sent events. Every text from the cluster goes into the page as text, never as
// markup. The token stays in this tab's sessionStorage and travels in a header only.
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
  abort: null,           // stops the live feed
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
const fmtNum = (n) => (n === Infinity ? '∞' : Number.isInteger(n) ? String(n) : n.toFixed(2));
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
const badge = (text, cls) => h('span', { class: `state ${cls || text}` }, text);
const resources = (set) => Object.entries(set || {}).map(([k, v]) => `${k}=${v}`).join(', ');
const nodeName = (id) => (S.nodes && S.nodes.get(id)) || (id === null || id === undefined ? '' : `node ${id}`);

/** One resource as a row: name, a bar of used over total, and the figures. */
function bar(r) {
  const total = num(r.total);
  const used = num(r.used);
  const unbounded = total === Infinity;
  const share = unbounded || total === 0 ? 0 : Math.min(100, (100 * used) / total);
  const cls = ['bar', r.physical ? '' : 'ephemeral', unbounded ? 'unbounded' : ''].join(' ');
  const free = unbounded ? '∞' : fmtNum(Math.max(0, total - used));
  return h('div', { class: 'res', 'data-resource': r.name },
    h('span', { class: 'name', title: r.name }, r.name),
    h('div', { class: cls, title: `${fmtNum(used)} used of ${fmtNum(total)}` },
      h('div', { style: `width:${share}%` })),
    h('span', { class: 'num' }, `${fmtNum(used)} / ${fmtNum(total)} (${free} free)`));
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
    ephemeral.length ? h('h4', {}, 'ephemeral and custom') : '', ephemeral.map(bar));
}

function renderEvents() {
  $('events').replaceChildren(...S.events.slice(0, 50).map((e) =>
    h('li', { 'data-kind': e.kind }, h('span', { class: 'rev' }, `#${e.revision}`), e.text)));
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
  else $('task-detail').hidden = true;
}

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

async function renderTaskDetail(id) {
  const detail = $('task-detail');
  let info;
  try {
    info = await api(`/api/tasks/${id}`);
  } catch (err) {
    detail.hidden = false;
    detail.replaceChildren(h('p', { class: 'error' }, `task ${id}: ${err.message}`));
    return;
  }
  const [kind, what] = describeKind(info.spec.kind);
  const pending = info.pending_reason;
  const labels = Object.entries(info.spec.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
  const rows = [
    ['state', badge(info.status.state)],
    ['name', info.spec.name],
    [kind, h('code', {}, what)],
    ['resources', resources(info.spec.resources)],
    labels ? ['labels', labels] : null,
    info.status.node !== null ? ['node', nodeName(info.status.node)] : null,
    info.status.reason ? ['why', info.status.reason] : null,
    pending ? ['pending', JSON.stringify(pending)] : null,
    info.status.result ? ['result', describeResult(info.status.result)] : null,
    ['submitted', new Date(info.submitted_at_ms).toLocaleString()],
    info.spec.max_retries ? ['retries allowed', info.spec.max_retries] : null,
  ].filter(Boolean);
  const attempts = h('table', { class: 'attempts' },
    h('thead', {}, h('tr', {}, ['attempt', 'node', 'started', 'ended'].map((c) => h('th', {}, c)))),
    h('tbody', {}, info.attempts.map((a) => h('tr', {},
      h('td', {}, a.attempt), h('td', {}, nodeName(a.node)),
      h('td', {}, new Date(a.started_at_ms).toLocaleTimeString()), h('td', {}, a.ended || 'running')))));
  const logs = h('div', { id: 'task-logs' }, h('p', { class: 'note' }, 'reading the output…'));
  const telemetry = h('div', { id: 'task-telemetry' });
  detail.hidden = false;
  detail.replaceChildren(
    h('h3', {}, `task ${info.status.id}`),
    h('dl', {}, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
    h('h4', {}, 'attempts'), attempts,
    h('h4', {}, 'telemetry'), telemetry,
    h('h4', {}, 'output (tail)'), logs);
  renderTelemetry(id, telemetry);
  if (!info.attempts.length) {
    logs.replaceChildren(h('p', { class: 'note' }, 'no attempt yet: no output'));
    return;
  }
  try {
    const tail = await api(`/api/tasks/${id}/logs`);
    const stream = (name, t) => [
      h('div', { class: 'note' }, name, t.truncated ? ' (last 64 KiB)' : '', t.notice ? ` — ${t.notice}` : ''),
      t.error ? h('p', { class: 'error' }, t.error) : h('pre', { 'data-stream': name }, t.text || '(empty)')];
    logs.replaceChildren(...stream('stdout', tail.stdout), ...stream('stderr', tail.stderr));
  } catch (err) {
    logs.replaceChildren(h('p', { class: 'error' }, err.message));
  }
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
  const held = new Map();
  for (const d of g.holders) {
    if (!held.has(d.uuid)) held.set(d.uuid, []);
    held.get(d.uuid).push(d.task);
  }
  const retiring = new Set(g.reconfiguring ? g.reconfiguring.retiring : []);
  const title = `${node.name} · GPU ${info.index} · ${info.product} · ${(info.memory_mib / 1024).toFixed(0)} GiB` +
    (info.simulated ? ' · simulated' : '');
  let drawing;
  if (info.mig_enabled) {
    const used = new Set();
    const cells = info.slices.map((s) => {
      for (let i = s.start; i < s.start + s.size; i++) used.add(i);
      const tasks = held.get(s.uuid) || [];
      const cls = retiring.has(s.uuid) ? 'retiring' : tasks.length ? 'busy' : 'idle';
      return h('div', {
        class: `slot ${cls}`, 'data-profile': s.profile, 'data-uuid': s.uuid,
        style: `grid-column: ${s.start + 1} / span ${s.size}`,
        title: `${s.profile} at slot ${s.start} · ${s.uuid}` + (tasks.length ? ` · task ${tasks.join(', ')}` : ' · idle'),
      }, h('b', {}, s.profile), h('br'), tasks.length ? `task ${tasks.join(', ')}` : retiring.has(s.uuid) ? 'retiring' : 'idle');
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
    drawing = h('div', { class: 'slots', style: 'grid-template-columns: 1fr' },
      h('div', { class: `slot ${tasks.length ? 'busy' : 'idle'}` }, h('b', {}, 'whole GPU (MIG off)'), h('br'),
        tasks.length ? `task ${tasks.join(', ')}` : 'idle'));
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

const VIEWS = {
  overview: renderOverview,
  tasks: renderTasks,
  reservations: renderReservations,
  gpus: renderGpus,
  heads: renderHeads,
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
  const [view, id] = (location.hash.slice(1) || 'overview').split('/');
  S.view = VIEWS[view] ? view : 'overview';
  S.selected = S.view === 'tasks' && id ? Number(id) : null;
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

async function live() {
  while (S.token) {
    const abort = new AbortController();
    S.abort = abort;
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
    setLive(false, 'reconnecting');
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// ---- signing in ---------------------------------------------------------------------------

async function signIn(token) {
  S.token = token;
  try {
    S.who = await api('/api/whoami');
  } catch (err) {
    signOut(err.message);
    return;
  }
  sessionStorage.setItem('escher.token', token);
  $('who').textContent = S.who.caller;
  $('sign-in').hidden = true;
  $('main').hidden = false;
  $('sign-out').hidden = false;
  route();
  live();
}

function signOut(why) {
  if (S.abort) S.abort.abort();
  S.token = null;
  S.who = null;
  S.revision = null;
  sessionStorage.removeItem('escher.token');
  $('main').hidden = true;
  $('sign-out').hidden = true;
  $('who').textContent = '';
  $('sign-in').hidden = false;
  $('sign-in-error').textContent = why || '';
  setLive(false);
}

function start() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get('token');
  if (given) {
    S.token = given;
    const view = fragment.get('view') || 'overview';
    history.replaceState(null, '', location.pathname + location.search + '#' + view);
  }
  $('sign-in-form').addEventListener('submit', (e) => {
    e.preventDefault();
    signIn($('token').value.trim());
  });
  $('sign-out').addEventListener('click', () => signOut());
  $('filters').addEventListener('submit', (e) => { e.preventDefault(); refresh(); });
  $('filters').addEventListener('reset', () => setTimeout(refresh, 0));
  window.addEventListener('hashchange', route);
  setInterval(() => { if (S.token && S.view === 'heads') refresh(); }, 3000);
  if (S.token) signIn(S.token);
  else signOut();
}

start();
