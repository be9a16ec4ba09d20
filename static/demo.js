// Parley demo page: the diagnostics view of one call. The call itself, its reconnects and its
// barge-in playback live in static/parley-call.js, shared with the embeddable widget; this
// page draws the state, the microphone level, the gateway's statistics, the transcript or
// dialog and the latency waterfall, and exposes the call as `window.parley` for tests.

import { ParleyCall, splitHeard } from "./parley-call.js";

const $ = (id) => document.getElementById(id);
const ui = {
  call: $("call"),
  hangUp: $("hangup"),
  state: $("state"),
  connection: $("connection"),
  level: $("level"),
  levelDb: $("level-db"),
  error: $("error"),
  rtt: $("rtt"),
  remote: $("remote"),
  stats: document.querySelectorAll("[data-stat]"),
  transcript: $("transcript"), // only in transcribe mode
  partial: $("partial"),
  dialog: $("dialog"), // only in conversation mode
  waterfall: document.querySelector("#waterfall tbody"),
};
const WATERFALL_TURNS = 5;
const STAGES = [
  "end_of_turn_ms", "responder_first_token_ms", "tts_first_audio_ms", "first_frame_ms", "browser_playout_ms",
];

function audioConstraints() {
  // Browser echo cancellation, noise suppression and AGC are right for people, but an
  // automated echo test needs the signal untouched: ?processing=off turns them off.
  const processing = new URLSearchParams(location.search).get("processing") !== "off";
  return { echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing };
}

// The test hook; also the page's whole state. In conversation mode the page plays Parley
// through WebAudio, so that it can cut a reply the caller talks over at once.
const parley = new ParleyCall({ audio: ui.remote, cutOnBargeIn: Boolean(ui.dialog), audioConstraints: audioConstraints() });
window.parley = parley;

// -- state and errors --------------------------------------------------------------------

parley.addEventListener("state", ({ detail: { state } }) => {
  ui.state.textContent = state;
  document.body.dataset.state = state;
  ui.call.disabled = parley.inCall;
  ui.hangUp.disabled = !parley.inCall;
  if (state === "calling") {
    clearError();
    resetStats();
  }
});

parley.addEventListener("failure", ({ detail: { message } }) => {
  ui.error.textContent = message;
  ui.error.hidden = false;
});

function clearError() {
  ui.error.textContent = "";
  ui.error.hidden = true;
}

parley.addEventListener("connection", ({ detail: { text } }) => { ui.connection.textContent = text; });
parley.addEventListener("roundtrip", ({ detail: { ms } }) => { ui.rtt.textContent = `${ms.toFixed(1)} ms`; });
parley.addEventListener("microphone", ({ detail: { stream } }) => (stream ? startLevelMeter(stream) : stopLevelMeter()));

// -- the gateway's events ----------------------------------------------------------------

// The turn's words so far: the settled ones, then (fainter) the latest reading's guess at the
// rest, which the next reading confirms or replaces.
function showPartial(text, tentative = "") {
  const settled = document.createElement("span");
  settled.textContent = text; // text, never HTML
  const guess = document.createElement("span");
  guess.className = "tentative";
  guess.textContent = text && tentative ? ` ${tentative}` : tentative;
  ui.partial.replaceChildren(settled, guess);
}

parley.addEventListener("gatewayevent", ({ detail: event }) => {
  switch (event.type) {
    case "call.stats":
      renderStats(event);
      break;
    case "transcript.partial":
      if (ui.partial) showPartial(event.text, event.tentative);
      break;
    case "transcript.final":
      if (ui.transcript && event.text) {
        const item = document.createElement("li");
        item.textContent = event.text; // text, never HTML
        ui.transcript.append(item);
      }
      if (ui.dialog && event.text) addUserWords(event.text);
      if (ui.partial) ui.partial.textContent = "";
      break;
    case "response.text.delta":
      if (ui.dialog) {
        assistantBubble(event.turn).dataset.text += event.delta;
        renderBubble(event.turn);
      }
      break;
    case "response.interrupted":
      if (ui.dialog) {
        assistantBubble(event.turn).dataset.heard = event.heard_text;
        renderBubble(event.turn);
      }
      break;
    case "metrics.turn":
      if (ui.waterfall) showTurnMetrics(event);
      break;
  }
});

// -- conversation view ---------------------------------------------------------------------

function addUserWords(text) {
  const last = ui.dialog.lastElementChild;
  if (last && last.classList.contains("user") && !last.dataset.closed) {
    last.textContent += ` ${text}`;
    return;
  }
  const item = document.createElement("li");
  item.className = "user";
  item.textContent = text;
  ui.dialog.append(item);
}

function assistantBubble(turn) {
  let item = ui.dialog.querySelector(`li.assistant[data-turn="${turn}"]`);
  if (!item) {
    for (const open of ui.dialog.querySelectorAll("li.user")) open.dataset.closed = "1";
    item = document.createElement("li");
    item.className = "assistant";
    item.dataset.turn = String(turn);
    item.dataset.text = "";
    ui.dialog.append(item);
  }
  return item;
}

// The heard part of a reply in plain text, the unheard rest struck through.
function renderBubble(turn) {
  const item = assistantBubble(turn);
  const text = item.dataset.text;
  item.textContent = "";
  if (item.dataset.heard === undefined) return (item.textContent = text);
  const { heard, unheard } = splitHeard(text, item.dataset.heard);
  item.append(document.createTextNode(heard + " "));
  const rest = document.createElement("s");
  rest.textContent = unheard;
  item.append(rest);
}

// A reply's stages come in two metrics.turn events: the gateway's own at its first frame,
// then browser_playout_ms once this page has reported the playout start. One row per reply.
function showTurnMetrics(event) {
  const fromGateway = "first_frame_ms" in event;
  let row = fromGateway ? null : ui.waterfall.querySelector(`tr[data-turn="${event.turn}"]`);
  if (!row) {
    if (!fromGateway) return; // its row has already scrolled away
    row = ui.waterfall.insertRow(0);
    row.dataset.turn = String(event.turn);
    while (ui.waterfall.rows.length > WATERFALL_TURNS) ui.waterfall.deleteRow(-1);
  }
  const metrics = { ...JSON.parse(row.dataset.metrics || "{}"), ...event };
  row.dataset.metrics = JSON.stringify(metrics);
  renderWaterfallRow(row, metrics);
}

function renderWaterfallRow(row, metrics) {
  // From the end of the caller's words to the first sound here, once the page has reported it.
  const total = metrics.total_ms == null ? null : roundTenth(metrics.total_ms + (metrics.browser_playout_ms ?? 0));
  const width = total || STAGES.reduce((sum, key) => sum + (metrics[key] || 0), 0) || 1;
  const bar = document.createElement("td");
  for (const key of STAGES) {
    const span = document.createElement("span");
    span.className = `stage ${key}`;
    span.style.width = `${Math.max(0, (100 * (metrics[key] || 0)) / width)}%`;
    span.title = `${key.replace(/_ms$/, "").replaceAll("_", " ")}: ${metrics[key] ?? "—"} ms`;
    bar.append(span);
  }
  row.replaceChildren(cell(String(metrics.turn)), bar, cell(total == null ? "—" : `${total} ms`));
}

const roundTenth = (x) => Math.round(10 * x) / 10;

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

// -- stats panel -------------------------------------------------------------------------

function renderStats(event) {
  for (const cell of ui.stats) {
    const value = cell.dataset.stat.split(".").reduce((obj, key) => obj?.[key], event);
    cell.textContent = formatValue(value, cell.dataset.unit);
  }
}

function formatValue(value, unit) {
  if (value === undefined || value === null) return "—";
  if (typeof value === "number") {
    const text = Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(1);
    return unit ? `${text} ${unit}` : text;
  }
  return String(value);
}

function resetStats() {
  for (const cell of ui.stats) cell.textContent = "—";
  ui.rtt.textContent = "—";
}

// -- microphone level meter --------------------------------------------------------------

let meter = null; // {stop()} while the level meter runs

function startLevelMeter(stream) {
  stopLevelMeter();
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  context.createMediaStreamSource(stream).connect(analyser); // analysis only; not played
  const samples = new Float32Array(analyser.fftSize);
  let frame = 0;
  const draw = () => {
    analyser.getFloatTimeDomainData(samples);
    const rms = Math.sqrt(samples.reduce((sum, x) => sum + x * x, 0) / samples.length);
    const db = 20 * Math.log10(Math.max(rms, 1e-6));
    ui.level.value = Math.min(1, Math.max(0, (db + 60) / 60)); // -60..0 dBFS -> 0..1
    ui.levelDb.textContent = db > -60 ? `${db.toFixed(0)} dBFS` : "silent";
    frame = requestAnimationFrame(draw);
  };
  context.resume().catch(() => {});
  draw();
  meter = {
    stop() {
      cancelAnimationFrame(frame);
      context.close().catch(() => {});
      ui.level.value = 0;
      ui.levelDb.textContent = "— dBFS";
    },
  };
}

function stopLevelMeter() {
  meter?.stop();
  meter = null;
}

// -- wiring ------------------------------------------------------------------------------

ui.call.addEventListener("click", () => parley.call());
ui.hangUp.addEventListener("click", () => parley.hangUp());
ui.state.textContent = parley.state;
document.body.dataset.state = parley.state;
ui.hangUp.disabled = true;
