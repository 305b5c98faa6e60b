// whip-ingest operator dashboard. Plain JavaScript, no framework, no build step.
//
// Rules:
// - Only the public REST API (/v1): sessions, runs, a run's events, thumbnails,
//   recordings, stop and delete. Nothing else is requested.
// - Every string shown is put in the page as a text node (textContent or
//   document.createTextNode); nothing from the server or the user is ever parsed as
//   HTML. The server's Content-Security-Policy forbids inline script as well.
// - The operator token: asked for when the API answers 401, kept in this tab's
//   sessionStorage only (never localStorage, never a cookie, never in a URL), sent as
//   "Authorization: Bearer". A 401 with a token clears it and asks again.
// - Thumbnails and recordings are fetched with the token and shown through blob URLs
//   (an <img src> cannot carry a bearer header); each blob URL is revoked when replaced.
// - Request budget: the session and run lists refresh every REFRESH_MS (default 5 s,
//   ?refresh_s=1..60); a live session's thumbnail is fetched only while its image is in
//   the viewport (IntersectionObserver) and the tab is visible, then every THUMBNAIL_MS
//   (twice REFRESH_MS) while it stays so, at once when it scrolls in and is due, one
//   request per row at a time; and the selected run's timeline is one long-poll at a time (wait 25 s) with at
//   least TIMELINE_GAP_MS between answered polls unless catching up a full page, ending
//   at run_deleted. Nothing is polled while the tab is hidden. That stays below one request per second per
//   visible session.
// - Deleted runs are listed only when the state filter asks for them ("deleted").
// - Stable hooks: run rows tr[data-run-id], session rows tr[data-session-id] with
//   img[data-thumbnail], buttons[data-action="stop"|"delete"|"timeline"], timeline
//   items li[data-seq][data-type]; document.body.dataset.state is "auth" while a token
//   is needed, else "ready".
"use strict";

const TOKEN_KEY = "whip-ingest.token";
const REFRESH_MS = refreshMs();
const THUMBNAIL_MS = 2 * REFRESH_MS;
// A list refresh lands a few ms either side of its interval: without slack a thumbnail
// due at the second refresh would often wait for the third.
const THUMBNAIL_SLACK_MS = REFRESH_MS / 4;
const TIMELINE_WAIT_S = 25;
const TIMELINE_LIMIT = 200;
const TIMELINE_GAP_MS = 2000;
const TIMELINE_KEEP = 500;
const ERROR_BACKOFF_MS = 5000;

const $ = (id) => document.getElementById(id);

function refreshMs() {
  const asked = Number(new URLSearchParams(location.search).get("refresh_s"));
  return Number.isFinite(asked) && asked >= 1 && asked <= 60 ? asked * 1000 : 5000;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// --------------------------------------------------------------- DOM, text only

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function status(text, isError) {
  setText($("status"), text);
  $("status").classList.toggle("error", Boolean(isError));
}

// --------------------------------------------------------------- the API

class AuthNeeded extends Error {}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, options) {
  const headers = new Headers((options && options.headers) || {});
  const held = token();
  if (held) headers.set("Authorization", "Bearer " + held);
  const response = await fetch(path, { ...options, headers, cache: "no-store" });
  if (response.status === 401) {
    askForToken(held ? "that token was refused" : "");
    throw new AuthNeeded("token needed");
  }
  if (!response.ok) {
    let code = "http_" + response.status;
    let message = response.statusText || code;
    try {
      const body = await response.json();
      code = body.error.code;
      message = body.error.message;
    } catch (_) {
      // not the API's JSON error shape: keep the status line
    }
    throw new ApiError(response.status, code, message);
  }
  return response;
}

async function apiJson(path, options) {
  return (await api(path, options)).json();
}

function runPath(runId, tail) {
  return "/v1/runs/" + encodeURIComponent(runId) + (tail || "");
}

// --------------------------------------------------------------- the token

function askForToken(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  document.body.dataset.state = "auth";
  $("token-form").hidden = false;
  $("dashboard").hidden = true;
  $("forget-token").hidden = true;
  setText($("token-error"), why);
  status("operator token needed");
}

function tokenReady() {
  document.body.dataset.state = "ready";
  $("token-form").hidden = true;
  $("dashboard").hidden = false;
  $("forget-token").hidden = !token();
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token-input").value.trim();
  $("token-input").value = "";
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  tokenReady();
  refreshNow();
});

$("forget-token").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.reload();
});

// --------------------------------------------------------------- formatting

function dash(value) {
  return value === null || value === undefined ? "-" : String(value);
}

function formatBitrate(bps) {
  if (bps === null || bps === undefined) return "-";
  return bps >= 1e6 ? (bps / 1e6).toFixed(2) + " Mb/s" : Math.round(bps / 1e3) + " kb/s";
}

function formatLoss(session) {
  const lost = session.packets_lost;
  const received = session.packets_received;
  if (lost === null || lost === undefined || !received) return "-";
  return ((100 * lost) / (lost + received)).toFixed(2) + " %";
}

function formatTime(ms) {
  return ms ? new Date(ms).toLocaleString() : "-";
}

function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "-";
  return bytes >= 1e6 ? (bytes / 1e6).toFixed(1) + " MB" : Math.round(bytes / 1e3) + " kB";
}

// --------------------------------------------------------------- live sessions

const sessionRows = new Map(); // session id -> {row, cells, img, runId, thumbAt, blobUrl,
//                                               visible, loading}
const thumbnailRows = new WeakMap(); // img[data-thumbnail] -> its session row's entry
const thumbnailWatch =
  "IntersectionObserver" in window ? new IntersectionObserver(thumbnailsSeen) : null;

// IntersectionObserver callback: note which thumbnails are in the viewport; one that
// came into view and is due is fetched now rather than at the next refresh.
function thumbnailsSeen(changes) {
  const now = Date.now();
  for (const change of changes) {
    const entry = thumbnailRows.get(change.target);
    if (!entry) continue;
    entry.visible = change.isIntersecting;
    if (thumbnailDue(entry, now)) {
      loadThumbnail(entry, now).catch((error) => report(error, "thumbnail"));
    }
  }
}

function thumbnailDue(entry, now) {
  return (
    entry.visible &&
    !entry.loading &&
    document.visibilityState === "visible" &&
    document.body.dataset.state === "ready" &&
    sessionRows.has(entry.id) &&
    now - entry.thumbAt >= THUMBNAIL_MS - THUMBNAIL_SLACK_MS
  );
}

function sessionRow(session) {
  let entry = sessionRows.get(session.id);
  if (entry) return entry;
  const img = el("img", { "data-thumbnail": "", alt: "thumbnail", width: 160, height: 90 });
  const cells = {};
  const row = el("tr", { "data-session-id": session.id, "data-session-run": session.run_id });
  row.append(el("td", {}, img));
  for (const name of ["stream", "principal", "codec", "size", "fps", "bitrate", "loss"]) {
    cells[name] = el("td", { "data-field": name });
    row.append(cells[name]);
  }
  for (const name of ["queue", "age"]) {
    cells[name] = el("td", { "data-field": name });
    row.append(cells[name]);
  }
  const timeline = el("button", { type: "button", "data-action": "timeline" }, "timeline");
  timeline.addEventListener("click", () => selectRun(session.run_id));
  row.append(el("td", {}, timeline));
  entry = {
    id: session.id,
    row,
    cells,
    img,
    runId: session.run_id,
    thumbAt: 0,
    blobUrl: null,
    visible: thumbnailWatch === null, // without the observer: every row counts as seen
    loading: false,
  };
  sessionRows.set(session.id, entry);
  thumbnailRows.set(img, entry);
  if (thumbnailWatch) thumbnailWatch.observe(img);
  return entry;
}

function dropSessionRow(id) {
  const entry = sessionRows.get(id);
  if (!entry) return;
  if (entry.blobUrl) URL.revokeObjectURL(entry.blobUrl);
  if (thumbnailWatch) thumbnailWatch.unobserve(entry.img);
  entry.row.remove();
  sessionRows.delete(id);
}

async function loadSessions() {
  const body = await apiJson("/v1/sessions");
  const tbody = $("sessions").tBodies[0];
  const seen = new Set();
  for (const session of body.items) {
    seen.add(session.id);
    const entry = sessionRow(session);
    const c = entry.cells;
    setText(c.stream, session.stream || "(none)");
    setText(c.principal, dash(session.principal));
    setText(c.codec, dash(session.codec));
    setText(c.size, session.width ? session.width + "x" + session.height : "-");
    setText(c.fps, session.fps === null || session.fps === undefined ? "-" : session.fps.toFixed(1));
    setText(c.bitrate, formatBitrate(session.bitrate_bps));
    setText(c.loss, formatLoss(session));
    setText(c.queue, dash(session.queue_depth));
    setText(c.age, Math.round(session.age_s) + " s");
    tbody.append(entry.row); // keeps the server's order; moves, never re-creates
  }
  for (const id of [...sessionRows.keys()]) if (!seen.has(id)) dropSessionRow(id);
  setText($("sessions-count"), "(" + seen.size + ")");
  $("sessions-empty").hidden = seen.size > 0;
  await refreshThumbnails();
}

async function refreshThumbnails() {
  const now = Date.now();
  const due = [...sessionRows.values()].filter((e) => thumbnailDue(e, now));
  await Promise.all(due.map((entry) => loadThumbnail(entry, now)));
}

async function loadThumbnail(entry, now) {
  entry.thumbAt = now;
  entry.loading = true;
  try {
    const blob = await (await api(runPath(entry.runId, "/thumbnail.jpg"))).blob();
    const url = URL.createObjectURL(blob);
    const old = entry.blobUrl;
    entry.blobUrl = url;
    entry.img.src = url;
    entry.img.dataset.loadedAt = String(now);
    if (old) URL.revokeObjectURL(old);
  } catch (error) {
    if (error instanceof ApiError && error.code === "no_thumbnail") {
      entry.thumbAt = now - THUMBNAIL_MS + REFRESH_MS; // none yet: ask again next refresh
      return;
    }
    throw error;
  } finally {
    entry.loading = false;
  }
}

// --------------------------------------------------------------- runs

const runRows = new Map(); // run id -> {row, cells}
let runsNext = null;

function runFilters() {
  const query = new URLSearchParams();
  const state = $("filter-state").value;
  const principal = $("filter-principal").value.trim();
  const stream = $("filter-stream").value.trim();
  if (state) query.set("state", state);
  if (principal) query.set("principal", principal);
  if (stream) query.set("stream", stream);
  return query;
}

function runRow(run) {
  let entry = runRows.get(run.id);
  if (entry) return entry;
  const cells = {};
  const row = el("tr", { "data-run-id": run.id });
  for (const name of ["id", "stream", "principal", "state", "created", "activity"]) {
    cells[name] = el("td", { "data-field": name });
    row.append(cells[name]);
  }
  const timeline = el("button", { type: "button", "data-action": "timeline" }, "timeline");
  const stop = el("button", { type: "button", "data-action": "stop" }, "stop");
  const remove = el("button", { type: "button", "data-action": "delete" }, "delete");
  timeline.addEventListener("click", () => selectRun(run.id));
  stop.addEventListener("click", () => act(run.id, "stop"));
  remove.addEventListener("click", () => act(run.id, "delete"));
  row.append(el("td", {}, timeline, stop, remove));
  entry = { row, cells, stop, remove };
  runRows.set(run.id, entry);
  return entry;
}

function showRun(run) {
  const entry = runRow(run);
  const c = entry.cells;
  setText(c.id, run.id);
  setText(c.stream, run.stream || "(none)");
  setText(c.principal, dash(run.principal));
  setText(c.state, run.state);
  setText(c.created, formatTime(run.created_ms));
  setText(c.activity, formatTime(run.last_activity_ms));
  entry.row.dataset.state = run.state;
  entry.stop.disabled = !["starting", "live", "expired"].includes(run.state);
  entry.remove.disabled = run.state === "deleted";
  return entry;
}

async function loadRuns(more) {
  const query = runFilters();
  if (more && runsNext) query.set("cursor", runsNext);
  const body = await apiJson("/v1/runs?" + query.toString());
  const tbody = $("runs").tBodies[0];
  const seen = new Set();
  const showDeleted = query.get("state") === "deleted";
  for (const run of body.items) {
    if (run.state === "deleted" && !showDeleted) continue; // deleted runs only on request
    seen.add(run.id);
    tbody.append(showRun(run).row);
  }
  if (!more) {
    // First page: rows the server no longer lists under these filters go away.
    for (const [id, entry] of [...runRows]) {
      if (!seen.has(id)) {
        entry.row.remove();
        runRows.delete(id);
      }
    }
  }
  runsNext = body.next;
  $("runs-more").hidden = !runsNext;
  $("runs-empty").hidden = runRows.size > 0;
}

async function act(runId, action) {
  try {
    if (action === "stop") {
      await apiJson(runPath(runId, "/stop"), { method: "POST" });
      status("run " + runId + " stopped");
    } else {
      await apiJson(runPath(runId), { method: "DELETE" });
      status("run " + runId + " deleted");
    }
  } catch (error) {
    report(error, action + " " + runId);
  }
  refreshNow();
}

$("run-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  runsNext = null;
  loadRuns(false).then(() => status("runs filtered"), (error) => report(error, "runs"));
});

$("runs-more").addEventListener("click", () => {
  loadRuns(true).catch((error) => report(error, "runs"));
});

// --------------------------------------------------------------- a run: timeline, recordings

let selected = null; // {runId, abort}

function selectRun(runId) {
  if (selected) selected.abort.abort();
  selected = { runId, abort: new AbortController() };
  $("run-panel").hidden = false;
  $("run-panel").dataset.runId = runId;
  setText($("run-title"), runId);
  $("timeline").replaceChildren();
  $("player").hidden = true;
  $("player").removeAttribute("src");
  followTimeline(selected);
  loadRecordings(runId).catch((error) => report(error, "recordings"));
}

function eventItem(event) {
  const data = event.data && Object.keys(event.data).length ? " " + JSON.stringify(event.data) : "";
  return el(
    "li",
    { "data-seq": event.seq, "data-type": event.type },
    el("time", {}, new Date(event.ts_ms).toLocaleTimeString()),
    " ",
    el("strong", {}, event.type),
    data,
  );
}

async function followTimeline(current) {
  let after = 0;
  const list = $("timeline");
  while (selected === current) {
    if (document.hidden) {
      await sleep(REFRESH_MS);
      continue;
    }
    let body;
    try {
      const query = "?after=" + after + "&limit=" + TIMELINE_LIMIT + "&wait=" + TIMELINE_WAIT_S;
      body = await apiJson(runPath(current.runId, "/events" + query), {
        signal: current.abort.signal,
      });
    } catch (error) {
      if (selected !== current || error.name === "AbortError") return;
      if (error instanceof ApiError && error.status === 404) {
        list.append(el("li", { class: "error" }, "run not found (deleted?)"));
        return;
      }
      report(error, "timeline");
      await sleep(ERROR_BACKOFF_MS);
      continue;
    }
    if (selected !== current) return;
    let deleted = false;
    for (const event of body.items) {
      list.append(eventItem(event));
      if (event.type === "recording_segment") {
        loadRecordings(current.runId).catch((error) => report(error, "recordings"));
      }
      deleted = deleted || event.type === "run_deleted";
    }
    if (deleted) return; // nothing follows a deletion: stop polling
    while (list.childElementCount > TIMELINE_KEEP) list.firstElementChild.remove();
    after = body.next;
    if (body.items.length > 0 && body.items.length < TIMELINE_LIMIT) await sleep(TIMELINE_GAP_MS);
  }
}

async function loadRecordings(runId) {
  const items = [];
  try {
    // Every page (the list is paged like the others: follow "next").
    let cursor = null;
    do {
      const page = await apiJson(
        runPath(runId, "/recordings") +
          "?limit=1000" +
          (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""),
      );
      items.push(...page.items);
      cursor = page.next;
    } while (cursor);
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 404)) throw error;
  }
  if (!selected || selected.runId !== runId) return;
  const list = $("recordings");
  list.replaceChildren();
  $("recordings-empty").hidden = items.length > 0;
  for (const item of items) {
    const play = el("button", { type: "button", "data-action": "play" }, "play");
    play.addEventListener("click", () => playRecording(runId, item));
    const text = item.name + " " + formatBytes(item.bytes) + " " + dash(item.duration_ms) + " ms";
    list.append(el("li", { "data-recording": item.name }, text + " ", play));
  }
}

let playerUrl = null;

async function playRecording(runId, item) {
  // Only this server's own recording URLs; anything else is rebuilt from the name.
  const own = typeof item.url === "string" && item.url.startsWith(runPath(runId, "/recordings/"));
  const path = own ? item.url : runPath(runId, "/recordings/" + encodeURIComponent(item.name));
  try {
    const blob = await (await api(path)).blob();
    const player = $("player");
    if (playerUrl) URL.revokeObjectURL(playerUrl);
    playerUrl = URL.createObjectURL(blob);
    player.src = playerUrl;
    player.hidden = false;
    player.dataset.recording = item.name;
  } catch (error) {
    report(error, "recording " + item.name);
  }
}

// --------------------------------------------------------------- refresh loop

function report(error, what) {
  if (error instanceof AuthNeeded) return;
  status(what + ": " + (error.message || String(error)), true);
}

let refreshing = null;
let refreshAgain = false;

async function refresh() {
  if (document.hidden || document.body.dataset.state === "auth") return;
  try {
    await Promise.all([loadSessions(), loadRuns(false)]);
    tokenReady();
    status("updated " + new Date().toLocaleTimeString());
  } catch (error) {
    report(error, "refresh");
  }
}

// One refresh at a time; one asked for meanwhile (after a stop or a delete) runs right
// after it, so the lists never show what was read before the action.
function refreshNow() {
  if (refreshing) {
    refreshAgain = true;
    return refreshing;
  }
  refreshing = refresh().finally(() => {
    refreshing = null;
    if (refreshAgain) {
      refreshAgain = false;
      refreshNow();
    }
  });
  return refreshing;
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) refreshNow();
});

document.body.dataset.state = "ready";
refreshNow();
setInterval(refreshNow, REFRESH_MS);
