// The session inspector: GET /admin/sessions as a table, one session's timeline as a chart and
// its calls as a conversation (the messages new in each, the answer, the error) with their
// events (new, or carried from an earlier call), archived items read in place from the archive
// route. Everything shown is set as text (never parsed as HTML); the key lives in this tab's
// sessionStorage only.
"use strict";

const KEY_ITEM = "agentproxy.inspector.key";
const LIST_REFRESH_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const keyNeeded = document.documentElement.dataset.key === "required";
let listTimer = null;

// ---- small helpers ------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function count(n) {
  return typeof n === "number" ? n.toLocaleString("en") : "–";
}

function money(usd) {
  if (typeof usd !== "number") return "–";
  return "$" + (usd > 0 && usd < 0.01 ? usd.toFixed(4) : usd.toFixed(2));
}

function when(seconds) {
  if (typeof seconds !== "number") return "–";
  const ago = Math.max(0, Date.now() / 1000 - seconds);
  if (ago < 60) return Math.round(ago) + " s ago";
  if (ago < 3600) return Math.round(ago / 60) + " min ago";
  if (ago < 86400) return Math.round(ago / 3600) + " h ago";
  return new Date(seconds * 1000).toLocaleString();
}

function stamp(seconds) {
  return typeof seconds === "number" ? new Date(seconds * 1000).toISOString() : "";
}

// A value as a person reads it: JSON pretty-printed (a string that holds JSON too), text as is.
function pretty(value) {
  if (typeof value === "string") {
    const trimmed = value.trim();
    if (/^[[{]/.test(trimmed)) {
      try {
        return JSON.stringify(JSON.parse(trimmed), null, 2);
      } catch {
        return value;
      }
    }
    return value;
  }
  return JSON.stringify(value, null, 2);
}

const FOLD_CHARS = 600, FOLD_LINES = 12;

// A block of text: shown whole when short, folded (its first line as the handle) when long.
function block(text, cls) {
  const body = el("pre", { class: cls || "" }, text);
  const lines = text.split("\n");
  if (text.length <= FOLD_CHARS && lines.length <= FOLD_LINES) return body;
  const head = lines[0].length > 90 ? lines[0].slice(0, 90) + "…" : lines[0];
  return el("details", { class: "fold" },
    el("summary", {}, `${head} (${count(lines.length)} lines, ${count(text.length)} chars)`), body);
}

function compact(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > 200 ? text.slice(0, 200) + "…" : text;
}

// The guards' record: the loop ladder's level and the failing streak, else "ok".
function guards(record) {
  if (!record || typeof record !== "object" || Object.keys(record).length === 0) return "ok";
  const parts = [];
  for (const [name, value] of Object.entries(record)) {
    if (name === "loop" && Array.isArray(value)) parts.push("loop level " + value[1]);
    else if (name === "circuit" && Array.isArray(value)) parts.push(value[0] + " failing");
    else parts.push(name + " " + compact(value));
  }
  return parts.join(", ");
}

// Turns of the session its recording does not hold, and why: "3 (dropped 2, failed 1)";
// null when there are none.
function notRecorded(s) {
  const reasons = Object.entries(s.not_recorded || {}).filter(([, n]) => n > 0);
  if (!reasons.length) return null;
  const total = reasons.reduce((sum, [, n]) => sum + n, 0);
  return count(total) + " (" + reasons.map(([why, n]) => why + " " + count(n)).join(", ") + ")";
}

// The list's mark on a session whose recording misses turns.
function notRecordedMark(s) {
  const missing = notRecorded(s);
  if (!missing) return null;
  return el("span", { class: "unrecorded" }, " · not recorded: " + missing);
}

function say(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text || "";
  status.className = isError ? "error" : "";
}

// ---- the key and the routes ------------------------------------------------------------------

function key() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

async function api(path) {
  const headers = key() ? { Authorization: "Bearer " + key() } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error && body.error.message;
    const error = new Error(message || "HTTP " + response.status);
    error.status = response.status;
    throw error;
  }
  return body;
}

function failed(error) {
  if (error.status === 401) {
    say("The proxy refused this key: enter an admin key or an API key.", true);
    document.getElementById("key").focus();
  } else {
    say(error.message, true);
  }
}

function setUpKey() {
  const form = document.getElementById("key-form");
  const field = document.getElementById("key");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (field.value) sessionStorage.setItem(KEY_ITEM, field.value);
    field.value = "";
    route();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_ITEM);
    route();
  });
}

function showKeyState() {
  document.getElementById("key").placeholder = key()
    ? "key set for this tab"
    : "admin key or API key";
}

// ---- the list ------------------------------------------------------------------------------

async function showList() {
  show("list-view");
  clearTimeout(listTimer);
  if (keyNeeded && !key()) {
    say("Enter an admin key (every session) or an API key (its own sessions).");
    return;
  }
  try {
    const list = await api("/admin/sessions");
    say("");
    renderList(list.data || []);
    listTimer = setTimeout(() => location.hash.startsWith("#session=") || showList(), LIST_REFRESH_MS);
  } catch (error) {
    failed(error);
  }
}

function renderList(sessions) {
  const body = document.querySelector("#sessions tbody");
  body.replaceChildren();
  for (const s of sessions) {
    const link = el("a", { href: "#session=" + encodeURIComponent(s.id) }, s.session || s.id);
    const last = el("td", { title: stamp(s.last_at) }, when(s.last_at));
    const row = el(
      "tr",
      { class: "session" + (s.errors ? " has-errors" : "") },
      el("td", {}, link),
      el("td", {}, s.key || s.owner || "–"),
      el("td", {}, s.model || "–"),
      el("td", { class: "num" }, turnsAndCalls(s), notRecordedMark(s)),
      el("td", { class: "num" }, count(s.tokens_received)),
      el("td", { class: "num" }, count(s.tokens_sent)),
      el("td", { class: "num" }, money(s.cost_usd)),
      last,
      el("td", {}, guards(s.guard)),
      el("td", { class: "num" }, count(s.errors)),
    );
    row.dataset.id = s.id;
    row.addEventListener("click", (event) => {
      if (event.target.tagName !== "A") location.hash = "#session=" + encodeURIComponent(s.id);
    });
    body.append(row);
  }
  document.getElementById("empty").hidden = sessions.length > 0;
}

// ---- one session ---------------------------------------------------------------------------

// `#session=` names a session by its id, or by the name its client gave it (what
// `agentproxy run` prints): the list's `?session=NAME` says which id that is (a key's own
// session of that name, however long ago it was active), the most recent one first.
async function resolve(wanted) {
  let named = [];
  try {
    named = (await api("/admin/sessions?session=" + encodeURIComponent(wanted))).data || [];
  } catch (error) {
    if (error.status !== 400) throw error;  // 400: longer than a name can be, so an id
  }
  if (!named.length) return { id: wanted, note: "" };  // an id (or no session of that name)
  history.replaceState(null, "", "#session=" + encodeURIComponent(named[0].id));
  const note = named.length > 1
    ? `${named.length} sessions are named “${wanted}”: the most recent one is shown.`
    : "";
  return { id: named[0].id, note };
}

async function showSession(wanted) {
  show("session-view");
  clearTimeout(listTimer);
  if (keyNeeded && !key()) {
    say("Enter an admin key or the API key of this session's owner.");
    return;
  }
  try {
    const { id, note } = await resolve(wanted);
    const session = await api(sessionPath(id, 0));
    say(note);
    renderSession(id, session);
  } catch (error) {
    failed(error);
  }
}

// The timeline comes in pages: `after` is the last turn shown (0: from the first).
function sessionPath(id, after) {
  return "/admin/sessions/" + encodeURIComponent(id) + (after ? "?after=" + after : "");
}

// The turns shown so far, and where the next page starts (null: none).
let shown = { id: null, timeline: [], next: null };

function renderSession(id, s) {
  document.getElementById("session-title").textContent = "Session " + (s.session || s.id);
  const facts = document.getElementById("session-facts");
  facts.replaceChildren();
  const rows = [
    ["key", s.key || s.owner],
    ["model", s.model],
    ["policy", s.policy],
    ["turns", turnsAndCalls(s)],
    ["turns not recorded", notRecorded(s)],
    ["tokens received", count(s.tokens_received)],
    ["tokens sent", count(s.tokens_sent)],
    ["cost", money(s.cost_usd)],
    ["last activity", when(s.last_at)],
    ["guards", guards(s.guard)],
    ["timeline", s.source === "recording" ? "recorded" : "last turns in memory"],
  ];
  for (const [name, value] of rows) {
    if (value === undefined || value === null) continue;
    facts.append(el("div", {}, el("dt", {}, name), el("dd", {}, value)));
  }
  const timeline = s.timeline || [];
  // The board keeps the last calls only: number them as the session counts them.
  const first = Math.max(1, (s.calls || s.turns || timeline.length) - timeline.length + 1);
  timeline.forEach((turn, i) => { if (typeof turn.call !== "number") turn.call = first + i; });
  shown = { id, timeline: [], next: null };
  document.getElementById("turns").replaceChildren();
  addTurns(timeline, s);
}

// "13 turns · 24 calls": a person's prompts apart from the calls the agent made for them.
function turnsAndCalls(s) {
  if (typeof s.calls !== "number" || s.calls === s.turns) return count(s.turns);
  return `${count(s.turns)} · ${count(s.calls)} calls`;
}

// A page of calls below those shown; the chart drawn again over all of them.
function addTurns(page, s) {
  shown.timeline.push(...page);
  shown.next = s.has_more ? s.next_after : null;
  const turns = document.getElementById("turns");
  if (shown.timeline.length) turns.start = shown.timeline[0].call;
  drawChart(shown.timeline, shown.timeline.length ? shown.timeline[0].call : 1);
  for (const turn of page) turns.append(renderTurn(turn));
  const more = document.getElementById("more");
  more.hidden = shown.next === null || shown.next === undefined;
  more.textContent = `more calls (after call ${shown.next})`;
}

async function showMore() {
  const more = document.getElementById("more");
  if (shown.next === null || more.disabled) return;
  more.disabled = true;
  try {
    const page = await api(sessionPath(shown.id, shown.next));
    addTurns(page.timeline || [], page);
  } catch (error) {
    failed(error);
  } finally {
    more.disabled = false;
  }
}

function drawChart(timeline, first) {
  const box = document.getElementById("chart-box");
  box.querySelector("svg")?.remove();
  const width = 760, height = 220, left = 64, right = 16, top = 12, bottom = 28;
  const chart = svg("svg", {
    id: "chart", viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "context tokens per call, received and sent",
  });
  const points = timeline.map((t) => ({
    received: (t.context && t.context.received) || 0,
    sent: (t.context && t.context.sent) || 0,
  }));
  const top_value = Math.max(1, ...points.map((p) => Math.max(p.received, p.sent)));
  const span = Math.max(1, points.length - 1);
  const x = (i) => left + ((width - left - right) * (points.length > 1 ? i / span : 0.5));
  const y = (v) => top + (height - top - bottom) * (1 - v / top_value);
  for (const fraction of [0, 0.5, 1]) {
    const value = Math.round(top_value * fraction);
    chart.append(svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid" }));
    const label = svg("text", { x: left - 6, y: y(value) + 4, class: "axis", "text-anchor": "end" });
    label.textContent = count(value);
    chart.append(label);
  }
  const step = Math.max(1, Math.ceil(points.length / 12));
  points.forEach((_, i) => {
    if (i % step && i !== points.length - 1) return;
    const label = svg("text", { x: x(i), y: height - 8, class: "axis", "text-anchor": "middle" });
    label.textContent = String(first + i);
    chart.append(label);
  });
  for (const series of ["received", "sent"]) {
    if (!points.length) break;
    const d = points
      .map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)} ${y(p[series]).toFixed(1)}`)
      .join(" ");
    chart.append(svg("path", { d, class: "line " + series }));
    points.forEach((p, i) => {
      const dot = svg("circle", { cx: x(i), cy: y(p[series]), r: 3, class: "dot " + series });
      const tip = svg("title");
      tip.textContent = `call ${first + i}: ${count(p[series])} tokens ${series}`;
      dot.append(tip);
      chart.append(dot);
    });
  }
  box.append(chart);
}

// One call: its client turn and number, what came in, what the model answered, what failed,
// and the events (those new in this call apart from those carried from earlier ones).
function renderTurn(turn) {
  const context = turn.context || {};
  const usage = turn.usage || {};
  const failedTurn = (turn.status || 200) >= 400 || (turn.errors && turn.errors.length);
  const numbered = typeof turn.turn === "number";
  const head = el(
    "div",
    { class: "turn-head" },
    el("strong", {}, numbered ? "Turn " + turn.turn : "Call " + turn.call),
    numbered ? el("span", { class: "call" }, "call " + turn.call + (turn.side ? " · side call" : turn.opens ? "" : " · continues")) : null,
    el("span", { title: stamp(turn.at) }, when(turn.at)),
    el("span", {}, turn.model || ""),
    el("span", { class: failedTurn ? "bad" : "ok" }, "HTTP " + (turn.status ?? "–")),
    el("span", {}, `context ${count(context.received)} → ${count(context.sent)} tokens`),
    usage.prompt_tokens !== undefined
      ? el("span", {}, `usage ${count(usage.prompt_tokens)} in, ${count(usage.completion_tokens)} out`)
      : null,
    turn.cost_usd ? el("span", {}, money(turn.cost_usd)) : null,
  );
  const events = el("ul", { class: "events" });
  const carried = el("ul", { class: "events" });
  for (const event of turn.events || []) (event.new === false ? carried : events).append(renderEvent(event));
  for (const step of turn.recoveries || []) {
    events.append(el("li", { class: "event recovery" }, el("span", { class: "tag" }, "recovery"), " " + step));
  }
  if (!events.children.length && !carried.children.length && !turn.error) {
    events.append(el("li", { class: "event quiet" }, "forwarded as received"));
  }
  const item = el("li", { class: "turn" + (failedTurn ? " failed" : "") + (turn.opens === false ? " continues" : "") + (turn.side ? " side" : "") }, head);
  const talk = conversation(turn);
  if (talk) item.append(talk);
  if (turn.error) item.append(renderError(turn.error));
  if (events.children.length) item.append(events);
  if (carried.children.length) {
    item.append(el("details", { class: "carried" },
      el("summary", {}, `${carried.children.length} carried from earlier calls (the same rewrite of the same messages)`),
      carried));
  }
  return item;
}

// What came in (the messages new in this call) and the model's answer, as a conversation.
function conversation(turn) {
  const messages = turn.messages_in;
  if (!Array.isArray(messages) && !turn.answer) return null;
  const box = el("div", { class: "conversation" });
  if (turn.messages_omitted) {
    box.append(el("p", { class: "omitted" }, `${count(turn.messages_omitted)} earlier new messages not shown (?full=1 has them)`));
  }
  for (const message of messages || []) box.append(renderMessage(message, message.role));
  if (turn.answer) {
    const label = "answer" + (turn.answer.stop ? " · stop: " + turn.answer.stop : "");
    box.append(renderMessage(turn.answer, label, "answer"));
  }
  return box;
}

function renderMessage(message, label, extra) {
  const role = message.role || "user";
  const box = el("div", { class: `message ${role}${extra ? " " + extra : ""}` }, el("span", { class: "role" }, label));
  const parts = message.parts || [];
  if (!parts.length) box.append(el("span", { class: "empty" }, "(empty)"));
  for (const part of parts) box.append(renderPart(part));
  return box;
}

function renderPart(part) {
  switch (part.type) {
    case "text":
      return block(part.text || "", "text");
    case "tool_call":
      return el("div", { class: "tool-call" },
        el("span", { class: "tool" }, `→ ${part.name || "tool"}`),
        part.id ? el("code", { class: "call-id" }, part.id) : null,
        block(pretty(part.arguments ?? {}), "args"));
    case "tool_result":
      return el("div", { class: "tool-result" + (part.error ? " error" : "") },
        el("span", { class: "tool" }, part.error ? "← error" : "← result"),
        part.id ? el("code", { class: "call-id" }, part.id) : null,
        block(pretty(part.content ?? ""), "result"));
    case "reasoning":
      return part.text ? el("div", { class: "reasoning" }, el("span", { class: "tool" }, "reasoning"), block(part.text, "text"))
        : el("span", { class: "reasoning quiet" }, "(reasoning, not readable)");
    default:
      return el("span", { class: "other" }, `[${part.kind || part.type}]`);
  }
}

// A failed call: its status, who said so and what.
function renderError(error) {
  const who = { upstream: "the upstream said", proxy: "the proxy said", stream: "the stream failed", client: "the client left" }[error.by] || "";
  return el("div", { class: "turn-error" },
    el("strong", {}, `HTTP ${error.status ?? "–"}${who ? " · " + who : ""}`),
    block(String(error.message ?? "(no message)"), "error-text"));
}

const KINDS = {
  repair: "repair", compat: "repair", offload: "offload", compaction: "compaction",
  recall: "recall", loops: "guard", budget: "guard", session_circuit: "guard", guard: "guard",
  retry: "recovery", fallback: "recovery", capabilities: "recovery", error: "error",
  stream: "error", record: "note",
};
const SPECIAL = new Set(["stage", "action", "ref", "refs", "summary", "seen", "new", "carried"]);

function renderEvent(event) {
  const kind = KINDS[event.stage] || "note";
  const failure = /failed|refused|block|error|unrecoverable|^deny$/.test(event.action || "");
  // A dry run's decision (guard.would_deny, …): computed and reported, nothing changed.
  const dry = /^would_/.test(event.action || "");
  const item = el(
    "li",
    { class: `event ${kind}${failure ? " error" : ""}${dry ? " dry" : ""}${event.new === false ? " carried" : ""}` },
    el("span", { class: "tag" }, `${event.stage}.${event.action}`),
  );
  if (event.new === true && event.carried) item.append(el("span", { class: "badge" }, `new, with ${event.carried} carried`));
  else if (event.new === true) item.append(el("span", { class: "badge" }, "new"));
  const fields = Object.entries(event).filter(([name]) => !SPECIAL.has(name));
  if (fields.length) {
    item.append(el("span", { class: "fields" }, fields.map(([k, v]) => `${k}: ${compact(v)}`).join(" · ")));
  }
  if (typeof event.summary === "string") {
    item.append(
      el("details", { class: "summary", open: "" },
        el("summary", {}, "the summary the model saw"),
        el("pre", {}, event.summary)),
    );
  }
  const refs = [...(event.ref ? [event.ref] : []), ...(Array.isArray(event.refs) ? event.refs : [])];
  for (const ref of refs) item.append(archived(ref, event));
  return item;
}

// What the request as sent had where the archived item was: the recording finds the text
// that names its ref (an offload's pointer, a summary).
function instead(ref, event) {
  if (event.seen && typeof event.seen[ref] === "string") return event.seen[ref];
  if (event.action === "summarized" && typeof event.summary === "string") return event.summary;
  if (event.seen) return "nothing in the request as sent names it: it left the context";
  return "not recorded: turn on record in this session's policy to keep the requests as sent";
}

// One archived item: its ref, and on demand what was stored beside what the model saw instead.
function archived(ref, event) {
  const box = el("div", { class: "archived" });
  const button = el("button", { type: "button", class: "show-archived" }, "show archived");
  box.append(el("code", { class: "ref" }, ref), " ", button);
  let panel = null;
  button.addEventListener("click", async () => {
    if (panel) {
      panel.hidden = !panel.hidden;
      button.textContent = panel.hidden ? "show archived" : "hide archived";
      return;
    }
    button.disabled = true;
    const stored = el("pre", { class: "stored" }, "loading…");
    const seen = instead(ref, event);
    panel = el(
      "div", { class: "side-by-side" },
      el("div", {}, el("h4", {}, "archived: what left the context"), stored),
      el("div", {},
        el("h4", {}, "what the model saw instead"),
        el("pre", { class: "seen" }, seen)),
    );
    box.append(panel);
    try {
      const item = await api("/v1/agentproxy/archive/" + encodeURIComponent(ref));
      stored.textContent = pretty(item.content);
      stored.title = `${item.kind}, ${count(item.size)} bytes, stored ${stamp(item.created_at)}`;
    } catch (error) {
      stored.textContent = "not readable: " + error.message;
      stored.classList.add("error");
    }
    button.disabled = false;
    button.textContent = "hide archived";
  });
  return box;
}

// ---- routing -------------------------------------------------------------------------------

function show(id) {
  for (const view of ["list-view", "session-view"]) {
    document.getElementById(view).hidden = view !== id;
  }
}

function route() {
  showKeyState();
  const match = /^#session=(.+)$/.exec(location.hash);
  if (!match) return showList();
  let wanted = match[1];
  try {
    wanted = decodeURIComponent(wanted);
  } catch {
    // a stray "%": the hash as it is
  }
  return showSession(wanted);
}

setUpKey();
document.getElementById("reload").addEventListener("click", route);
document.getElementById("more").addEventListener("click", showMore);
window.addEventListener("hashchange", route);
route();
