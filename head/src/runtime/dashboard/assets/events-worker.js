// The escher dashboard's live feed, shared by every tab of the browser (a SharedWorker).
//
// A browser opens at most six HTTP/1.1 connections to one host; a live feed holds one for as
// long as it runs, so a feed per tab would leave the seventh tab with no connection at all,
// not even to draw itself. Here one feed per token serves every tab signed in with it: each tab
// connects, says which token it watches with ({type: 'watch', token}), and receives
//   {type: 'recent', revision, events}  the events this feed has kept, newest first (once),
//   {type: 'batch', batch}              each batch from the head, as it arrives,
//   {type: 'live', on, why}             whether the feed is up, and why not.
// {type: 'stop'} (a tab signing out or closing) leaves the feed; the last tab to leave ends it.
// The token travels in a header, as everywhere in the page; it never goes into a URL.
'use strict';

const RECENT = 50;
const KEPT = 200;

/** token -> {ports: Set<MessagePort>, revision, events, live, abort, stopped} */
const feeds = new Map();
/** port -> the feed it watches */
const watching = new Map();

function post(feed, message) {
  for (const port of feed.ports) {
    try { port.postMessage(message); } catch { /* a closed tab */ }
  }
}

function setLive(feed, on, why) {
  feed.live = { type: 'live', on, why: why || '' };
  post(feed, feed.live);
}

function leave(port) {
  const feed = watching.get(port);
  watching.delete(port);
  if (!feed) return;
  feed.ports.delete(port);
  if (feed.ports.size === 0) {
    feed.stopped = true;
    if (feed.abort) feed.abort.abort();
    feeds.delete(feed.token);
  }
}

function watch(port, token) {
  leave(port);
  let feed = feeds.get(token);
  if (!feed) {
    feed = { token, ports: new Set(), revision: null, events: [], live: null, abort: null, stopped: false };
    feeds.set(token, feed);
    run(feed);
  }
  feed.ports.add(port);
  watching.set(port, feed);
  port.postMessage({ type: 'recent', revision: feed.revision, events: feed.events });
  if (feed.live) port.postMessage(feed.live);
}

function onBatch(feed, batch) {
  feed.revision = batch.revision;
  for (const e of batch.events) feed.events.unshift(e);
  feed.events.length = Math.min(feed.events.length, KEPT);
  post(feed, { type: 'batch', batch });
}

/** Reads the head's feed for `feed.token` until the last tab leaves, resuming after the last
 *  revision seen when the connection breaks. */
async function run(feed) {
  while (!feed.stopped) {
    const abort = new AbortController();
    feed.abort = abort;
    try {
      const after = feed.revision === null ? `?recent=${RECENT}` : `?after=${feed.revision}`;
      const response = await fetch('/api/events' + after, {
        headers: { Authorization: 'Bearer ' + feed.token }, signal: abort.signal,
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        if (body.code === 'OutOfRange') {
          feed.revision = null;
          post(feed, { type: 'resync' });
          continue;
        }
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
          if (event === 'batch') {
            onBatch(feed, JSON.parse(data.join('\n')));
            if (!feed.live || !feed.live.on) setLive(feed, true, `watching from revision ${feed.revision}`);
          } else if (event === 'end') {
            const why = data.join('\n');
            if (why.startsWith('OutOfRange')) feed.revision = null;
            setLive(feed, false, why);
          }
        }
      }
    } catch (err) {
      if (feed.stopped) return;
      setLive(feed, false, err.message);
    }
    if (feed.stopped) return;
    setLive(feed, false, 'reconnecting');
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

self.addEventListener('connect', (e) => {
  const port = e.ports[0];
  port.addEventListener('message', (m) => {
    const message = m.data || {};
    if (message.type === 'watch' && typeof message.token === 'string' && message.token) watch(port, message.token);
    else if (message.type === 'stop') leave(port);
  });
  port.start();
});
