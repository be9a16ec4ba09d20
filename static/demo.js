// Parley demo client: one WebRTC call to the gateway with non-trickle signaling.
//
// Flow: microphone -> RTCPeerConnection (audio sendrecv + "events" data channel) -> wait for
// ICE gathering -> POST /v1/calls -> apply the answer. The gateway reports on the data
// channel; this page shows its events and exposes `window.parley` for automated tests.
//
// A dropped connection (ICE failed, ICE disconnected for 3 s, no pong for 5 s, the events
// channel closing) or a session.migrate from a draining gateway starts a reconnect: a new
// RTCPeerConnection, the same microphone, and POST /v1/calls {resume_token, last_seq}, with
// backoff (1, 2, 4, 4, 4 s; 5 tries). The gateway replays the events this page missed.
//
// In conversation mode the page plays Parley through WebAudio, so that it can cut a reply the
// caller talks over at once (playback.cut), and tells the gateway when each reply starts
// playing here (playout.started), the last stage of the turn's latency (see "playback" below).

const ICE_GATHER_TIMEOUT_MS = 3000; // non-trickle: after this, send what has been gathered
const PING_INTERVAL_MS = 2000;
const HANGUP_TIMEOUT_MS = 3000;
const MAX_KEPT_EVENTS = 1000; // call.stats arrives every second or so; keep memory bounded
const PING_TIMEOUT_MS = 5000; // no pong for this long: the path is dead
const DISCONNECTED_GRACE_MS = 3000; // ICE "disconnected" often recovers by itself within this
const CONNECT_TIMEOUT_MS = 10000; // one reconnect try waits this long for "connected"
const RECONNECT_DELAYS_MS = [1000, 2000, 4000, 4000, 4000];
const FINAL_END_REASONS = ["replaced", "taken_over", "hangup", "assistant_ended", "idle", "stt_failed", "error"]; // session.ended: do not reconnect

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
const PLAYOUT_WATCH_MS = 10000; // a reply not heard within this after its response.audio.start is not reported

// The test hook; also the page's whole state.
const parley = {
  state: "idle", // idle | calling | connected | reconnecting | ended | failed
  events: [],
  error: null,
  pc: null,
  location: null, // the call's URL, for DELETE
  ready: null, // the session.ready event
  sessionId: null,
  resumeToken: null, // never logged
  lastSeq: 0, // the highest event seq received; sent on resume so only missed events are replayed
  reconnects: 0, // successful reconnects in this session
  cuts: [], // turns whose playback this page cut (response.paused / .interrupted)
  call,
  hangUp,
  // Conversation mode: the AudioContext and the node whose output is what this page plays.
  get playback() {
    return playback && { context: playback.context, output: playback.output };
  },
};
window.parley = parley;

let localStream = null;
let meter = null; // {stop()} while the level meter runs
let pingTimer = null;
let nextPingId = 1;
let lastPongAt = 0; // performance.now() of the last pong (or of the channel opening)
let disconnectedTimer = null;
let currentAttempt = 0; // bumped by every call() and every hang-up
let eventsChannel = null; // the current connection's "events" data channel
// False on a resumed connection until its session.ready: the events before it are replays
// of what this page missed, and their replies are not playing now.
let eventsLive = false;
let playback = null; // conversation mode: {context, output, onset: Promise<AudioWorkletNode>, source, cutTurn}
let playoutTimer = null; // disarms the detector when an announced reply stays silent
const pingsSent = new Map(); // id -> performance.now()

// -- state and errors --------------------------------------------------------------------

function setState(state) {
  parley.state = state;
  ui.state.textContent = state;
  document.body.dataset.state = state;
  const inCall = state === "calling" || state === "connected" || state === "reconnecting";
  ui.call.disabled = inCall;
  ui.hangUp.disabled = !inCall;
}

function showError(message) {
  parley.error = message;
  ui.error.textContent = message;
  ui.error.hidden = false;
  console.warn("parley:", message);
}

function clearError() {
  parley.error = null;
  ui.error.textContent = "";
  ui.error.hidden = true;
}

function showConnection(pc) {
  ui.connection.textContent =
    `(connection ${pc.connectionState}, ICE ${pc.iceConnectionState}, gathering ${pc.iceGatheringState})`;
}

// -- placing a call ----------------------------------------------------------------------

async function call() {
  if (parley.state === "calling" || parley.state === "connected") return;
  const attempt = ++currentAttempt;
  // Hanging up while a step is pending starts a new attempt; the old one then just stops.
  const superseded = () => attempt !== currentAttempt;
  clearError();
  parley.events = [];
  parley.ready = null;
  parley.location = null;
  parley.sessionId = parley.resumeToken = null;
  parley.lastSeq = parley.reconnects = 0;
  parley.cuts = [];
  resetStats();
  setState("calling");
  try {
    const stream = await openMicrophone();
    if (superseded()) return stream.getTracks().forEach((track) => track.stop());
    localStream = stream;
    startLevelMeter(stream);
    eventsLive = true; // a new session: nothing to replay
    const pc = createPeerConnection(stream);
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, ICE_GATHER_TIMEOUT_MS);
    if (superseded()) return;
    logCandidates("local", pc.localDescription.sdp);
    const { answer, callUrl } = await postOffer({ sdp: pc.localDescription.sdp, type: "offer" });
    if (superseded()) return deleteCall(callUrl); // the gateway answered a call nobody wants now
    parley.location = callUrl;
    logCandidates("remote", answer.sdp);
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  } catch (err) {
    if (!superseded()) await fail(err.message || String(err));
  }
}

function audioConstraints() {
  // Browser echo cancellation, noise suppression and AGC are right for people, but an
  // automated echo test needs the signal untouched: ?processing=off turns them off.
  const processing = new URLSearchParams(location.search).get("processing") !== "off";
  return { echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing };
}

async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error("This browser cannot capture audio here (getUserMedia needs HTTPS or localhost).");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({ audio: audioConstraints(), video: false });
  } catch (err) {
    if (err.name === "NotAllowedError") {
      throw new Error("Microphone access was denied. Allow it in the browser's site settings and call again.");
    }
    if (err.name === "NotFoundError") throw new Error("No microphone was found.");
    throw new Error(`Cannot open the microphone: ${err.name}: ${err.message}`);
  }
}

function createPeerConnection(stream) {
  // No STUN/TURN: the gateway offers its own reachable host candidates.
  const pc = new RTCPeerConnection({ iceServers: [] });
  parley.pc = pc;
  const [track] = stream.getAudioTracks();
  pc.addTransceiver(track, { direction: "sendrecv", streams: [stream] });
  // The gateway only adopts a channel the client opened, and it must be in the offer.
  eventsChannel = pc.createDataChannel("events");
  openEventsChannel(pc, eventsChannel);
  pc.ontrack = (event) => playRemote(event.streams[0] || new MediaStream([event.track]));
  pc.onconnectionstatechange = () => onConnectionState(pc);
  pc.oniceconnectionstatechange = () => {
    console.debug("parley: ICE", pc.iceConnectionState);
    showConnection(pc);
    watchDisconnected(pc);
  };
  pc.onicegatheringstatechange = () => showConnection(pc);
  pc.onicecandidateerror = (e) => console.debug("parley: candidate error", e.errorCode, e.errorText, e.url);
  showConnection(pc);
  return pc;
}

function iceGatheringComplete(pc, timeoutMs) {
  return new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => pc.iceGatheringState === "complete" && done();
    const timer = setTimeout(() => {
      console.debug("parley: ICE gathering still running; sending the candidates found so far");
      done();
    }, timeoutMs);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function logCandidates(side, sdp) {
  // Helps explain ICE failures (e.g. only mDNS .local candidates, or no loopback).
  const candidates = sdp.split(/\r?\n/).filter((line) => line.startsWith("a=candidate:"));
  console.debug(`parley: ${side} candidates:\n${candidates.join("\n") || "(none)"}`);
}

async function postOffer(offer) {
  const response = await fetch("/v1/calls", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(offer),
  });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body?.error ? `${body.error.message} (${body.error.code})` : response.statusText;
    const error = new Error(`The gateway refused the call: HTTP ${response.status}: ${detail}`);
    error.status = response.status;
    throw error;
  }
  parley.sessionId = body.session_id;
  parley.resumeToken = body.resume_token;
  // A 307 from a draining gateway lands on a peer: calls live at the URL that answered.
  const callUrl = new URL(response.headers.get("Location") || `/v1/calls/${body.call_id}`, response.url).href;
  return { answer: body, callUrl };
}

function playRemote(stream) {
  ui.remote.srcObject = stream;
  // autoplay may be blocked without a gesture; the Call click normally counts as one.
  ui.remote.play().catch((err) => console.debug("parley: remote audio play():", err.message));
  if (ui.dialog) playThroughOutput(stream);
}

async function onConnectionState(pc) {
  showConnection(pc);
  if (parley.pc !== pc) return;
  if (pc.connectionState === "connected") {
    if (parley.state !== "reconnecting") setState("connected");
  } else if (pc.connectionState === "failed" && parley.state === "connected") {
    reconnect("the connection failed");
  } else if (pc.connectionState === "failed" && parley.state === "calling") {
    await fail(`ICE failed: no working network path to the gateway (ICE state ${pc.iceConnectionState}).`);
  }
}

function watchDisconnected(pc) {
  clearTimeout(disconnectedTimer);
  if (pc.iceConnectionState !== "disconnected") return;
  disconnectedTimer = setTimeout(() => {
    if (parley.pc === pc && pc.iceConnectionState === "disconnected" && parley.state === "connected") {
      reconnect("ICE stayed disconnected");
    }
  }, DISCONNECTED_GRACE_MS);
}

// -- the events data channel -------------------------------------------------------------

function openEventsChannel(pc, channel) {
  channel.onopen = () => {
    lastPongAt = performance.now();
    sendPing(channel);
    clearInterval(pingTimer);
    pingTimer = setInterval(() => {
      if (performance.now() - lastPongAt > PING_TIMEOUT_MS && parley.pc === pc && parley.state === "connected") {
        return reconnect("no pong from the gateway");
      }
      sendPing(channel);
    }, PING_INTERVAL_MS);
  };
  channel.onmessage = (message) => onEvent(parseEvent(message.data));
  channel.onclose = () => {
    if (parley.pc !== pc) return;
    clearInterval(pingTimer);
    // Without a session.ended first, a closing channel means the call dropped (a node
    // died or restarted): the session lives on, so resume it.
    if (parley.state === "connected") reconnect("the events channel closed");
  };
}

function parseEvent(data) {
  try {
    const event = JSON.parse(data);
    return event && typeof event.type === "string" ? event : null;
  } catch {
    return null;
  }
}

function onEvent(event) {
  if (!event) return console.warn("parley: ignoring a malformed event");
  if (typeof event.seq === "number") {
    if (event.seq <= parley.lastSeq) return; // already seen (a replay overlapping what arrived)
    parley.lastSeq = event.seq;
  }
  parley.events.push(event);
  if (parley.events.length > MAX_KEPT_EVENTS) parley.events.splice(0, parley.events.length - MAX_KEPT_EVENTS);
  switch (event.type) {
    case "session.ready":
      parley.ready = event;
      eventsLive = true;
      console.debug(`parley: session ready, mode ${event.mode}, echo delay ${event.echo_delay_ms} ms`);
      break;
    case "call.stats":
      renderStats(event);
      break;
    case "pong":
      lastPongAt = performance.now();
      showRoundTrip(event.ping_id);
      break;
    case "session.migrate": // the gateway is draining: move to another node now
      parley.resumeToken = event.resume_token;
      reconnect("the gateway asked to migrate", 0);
      break;
    case "session.ended":
      if (FINAL_END_REASONS.includes(event.reason)) endCall(`The call ended (${event.reason}).`);
      break;
    case "error":
      showError(`Gateway error: ${event.message} (${event.code})`);
      break;
    case "transcript.partial":
      if (ui.partial) ui.partial.textContent = event.text;
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
    case "response.paused":
      if (eventsLive) cutPlayback(event.turn);
      break;
    case "response.continued":
      openPlayback();
      break;
    case "response.interrupted":
      if (eventsLive) cutPlayback(event.turn);
      if (ui.dialog) {
        assistantBubble(event.turn).dataset.heard = event.heard_text;
        renderBubble(event.turn);
      }
      break;
    case "response.audio.start":
      openPlayback();
      if (eventsLive) armPlayout(event.turn);
      break;
    case "metrics.turn":
      if (ui.waterfall) showTurnMetrics(event);
      break;
  }
}

function sendPing(channel) {
  if (channel.readyState !== "open") return;
  const id = nextPingId++;
  pingsSent.set(id, performance.now());
  channel.send(JSON.stringify({ type: "ping", id }));
}

function showRoundTrip(id) {
  const sentAt = pingsSent.get(id);
  if (sentAt === undefined) return;
  pingsSent.delete(id);
  ui.rtt.textContent = `${(performance.now() - sentAt).toFixed(1)} ms`;
}

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
  const heardWords = item.dataset.heard.split(/\s+/).filter(Boolean).length;
  const words = text.split(/\s+/).filter(Boolean);
  item.append(document.createTextNode(words.slice(0, heardWords).join(" ") + " "));
  const rest = document.createElement("s");
  rest.textContent = words.slice(heardWords).join(" ");
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

// -- playback (conversation mode) ---------------------------------------------------------

// The page plays Parley through WebAudio: remote stream -> `output` gain -> speakers. The
// <audio> element keeps the stream attached but muted (Chromium feeds a remote WebRTC stream
// to WebAudio only while a media element plays it); if the AudioContext cannot run (an
// autoplay policy), the element plays instead. Owning the output serves two things:
//
// Barge-in. When the gateway pauses or interrupts a reply for the caller (response.paused,
// response.interrupted), the audio it sent last is still on its way: the network and this
// browser's jitter buffer hold ~100 ms of it. The page cuts it at once (a CUT_FADE_S fade,
// so no click), tells the gateway (playback.cut {turn}: a reply that plays on is rewound by
// what was cut, and an interrupted one counts only what was heard), and opens again on
// response.continued or the next reply's response.audio.start.
//
// Playout start. The gateway knows when it sent a reply's first frame, not when it began to
// play here. An AudioWorklet (static/playout-onset.js) on `output`, what this page plays,
// hears the first sound after response.audio.start; the page sends playout.started {turn}
// and the gateway times that last stage on its own clock (the two clocks differ), from its
// first frame to this report's arrival. Not RTCRtpReceiver.getSynchronizationSources()
// .audioLevel: it describes packets as they arrive (before the jitter buffer), and only from
// an audio-level header extension that Parley's sender does not write. Not an AnalyserNode
// polled by a timer: timers run late on a busy main thread and barely at all in a background tab.
const CUT_FADE_S = 0.005;

function startPlayback() {
  const context = new AudioContext({ latencyHint: "interactive" });
  context.resume().catch(() => {});
  const output = context.createGain();
  output.connect(context.destination);
  const onset = context.audioWorklet.addModule("/static/playout-onset.js").then(() => {
    const worklet = new AudioWorkletNode(context, "playout-onset");
    worklet.port.onmessage = (message) => reportPlayout(message.data.turn);
    const mute = context.createGain(); // rendered, so that it runs, but silent
    mute.gain.value = 0;
    output.connect(worklet).connect(mute).connect(context.destination);
    return worklet;
  });
  // The element plays only while the context cannot (both at once would double the audio).
  const muteElementWhileContextRuns = () => { ui.remote.muted = context.state === "running"; };
  context.onstatechange = muteElementWhileContextRuns;
  muteElementWhileContextRuns();
  return { context, output, onset, source: null, cutTurn: null };
}

// A new remote stream (the call, or a reconnect) goes into the same output.
function playThroughOutput(stream) {
  playback ??= startPlayback();
  playback.source?.disconnect();
  playback.source = playback.context.createMediaStreamSource(stream);
  playback.source.connect(playback.output);
}

function cutPlayback(turn) {
  if (!playback || playback.cutTurn === turn) return;
  playback.cutTurn = turn;
  parley.cuts.push(turn);
  setPlaybackGain(0);
  if (eventsChannel?.readyState === "open") eventsChannel.send(JSON.stringify({ type: "playback.cut", turn }));
}

function openPlayback() {
  if (!playback || playback.cutTurn === null) return;
  playback.cutTurn = null;
  setPlaybackGain(1);
}

function setPlaybackGain(value) {
  const { context, output } = playback;
  ui.remote.volume = value; // (what plays while the context cannot run)
  const now = context.currentTime;
  output.gain.cancelScheduledValues(now);
  output.gain.setValueAtTime(output.gain.value, now);
  output.gain.linearRampToValueAtTime(value, now + CUT_FADE_S);
}

function armPlayout(turn) {
  if (!playback) return;
  const tell = (message) => playback.onset.then((node) => node.port.postMessage(message)).catch(() => {});
  tell({ turn });
  clearTimeout(playoutTimer);
  playoutTimer = setTimeout(() => tell({ turn: null }), PLAYOUT_WATCH_MS);
}

function reportPlayout(turn) {
  clearTimeout(playoutTimer);
  if (eventsChannel?.readyState === "open") eventsChannel.send(JSON.stringify({ type: "playout.started", turn }));
}

function stopPlayback() {
  clearTimeout(playoutTimer);
  playback?.context.close().catch(() => {});
  playback = null;
  ui.remote.muted = false;
  ui.remote.volume = 1;
}

// -- reconnecting ------------------------------------------------------------------------

async function reconnect(why, firstDelayMs = RECONNECT_DELAYS_MS[0]) {
  if (parley.state !== "connected" || !parley.resumeToken) return;
  console.info(`parley: reconnecting: ${why}`);
  setState("reconnecting");
  ui.connection.textContent = "reconnecting…";
  const attempt = ++currentAttempt;
  closePeer(dropPeer());
  for (let i = 0; i < RECONNECT_DELAYS_MS.length; i++) {
    await sleep(i === 0 ? firstDelayMs : RECONNECT_DELAYS_MS[i]);
    if (attempt !== currentAttempt) return; // hung up meanwhile
    try {
      await resumeOnce(attempt);
      if (attempt !== currentAttempt) return;
      parley.reconnects++;
      setState("connected");
      return;
    } catch (err) {
      if (attempt !== currentAttempt) return;
      closePeer(dropPeer());
      console.warn(`parley: reconnect try ${i + 1} failed: ${err.message}`);
      if (err.status === 401 || err.status === 404) return fail(`The session cannot be resumed: ${err.message}`);
    }
  }
  await fail("The connection to the gateway was lost and could not be restored.");
}

async function resumeOnce(attempt) {
  eventsLive = false; // until this connection's session.ready
  const pc = createPeerConnection(localStream);
  await pc.setLocalDescription(await pc.createOffer());
  await iceGatheringComplete(pc, ICE_GATHER_TIMEOUT_MS);
  if (attempt !== currentAttempt) return;
  const { answer, callUrl } = await postOffer({
    sdp: pc.localDescription.sdp, type: "offer", resume_token: parley.resumeToken, last_seq: parley.lastSeq,
  });
  if (attempt !== currentAttempt) return deleteCall(callUrl);
  parley.location = callUrl;
  await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  await connected(pc, CONNECT_TIMEOUT_MS);
}

function connected(pc, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no connection within the timeout")), timeoutMs);
    const check = () => {
      if (pc.connectionState === "connected") {
        clearTimeout(timer);
        resolve();
      } else if (pc.connectionState === "failed" || pc.connectionState === "closed") {
        clearTimeout(timer);
        reject(new Error(`connection ${pc.connectionState}`));
      }
    };
    pc.addEventListener("connectionstatechange", check);
    check();
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

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

// -- ending a call -----------------------------------------------------------------------

// Stops pings and detaches the peer connection, so its late events are ignored; the
// microphone stays open (a reconnect reuses it). Returns the connection, still open.
function dropPeer() {
  clearInterval(pingTimer);
  clearTimeout(disconnectedTimer);
  pingsSent.clear();
  const pc = parley.pc;
  parley.pc = null;
  parley.location = null;
  return pc;
}

// Stops capture, playback and pings at once and detaches the peer connection.
function detachCall() {
  currentAttempt++;
  stopLevelMeter();
  stopPlayback();
  localStream?.getTracks().forEach((track) => track.stop());
  localStream = null;
  ui.remote.srcObject = null;
  return dropPeer();
}

function closePeer(pc) {
  if (!pc) return;
  pc.close();
  showConnection(pc);
}

function takeCallUrl() {
  const url = parley.location;
  parley.location = null;
  return url;
}

async function deleteCall(url) {
  if (!url) return;
  try {
    const response = await fetch(url, { method: "DELETE", signal: AbortSignal.timeout(HANGUP_TIMEOUT_MS) });
    // 404: the gateway already ended the call (e.g. timeout); nothing left to do.
    if (!response.ok && response.status !== 404) {
      console.warn(`parley: hang-up returned HTTP ${response.status}`);
    }
  } catch (err) {
    console.warn("parley: hang-up request failed:", err.message);
  }
}

async function hangUp() {
  if (!["calling", "connected", "reconnecting"].includes(parley.state)) return;
  const callUrl = takeCallUrl();
  const pc = detachCall(); // silent at once
  setState("ended");
  // DELETE before closing, so the gateway ends the call as a hang-up rather than noticing a
  // dropped connection; the timeout keeps an unreachable gateway from holding the close.
  await deleteCall(callUrl);
  closePeer(pc);
}

function endCall(reason) {
  takeCallUrl(); // the gateway has already forgotten the call
  closePeer(detachCall());
  ui.connection.textContent = reason;
  setState("ended");
}

async function fail(message) {
  const callUrl = takeCallUrl();
  showError(message);
  closePeer(detachCall());
  setState("failed");
  await deleteCall(callUrl);
}

// -- wiring ------------------------------------------------------------------------------

ui.call.addEventListener("click", () => call());
ui.hangUp.addEventListener("click", () => hangUp());
// Free the gateway's session slot when the tab goes away; keepalive outlives the page.
window.addEventListener("pagehide", () => {
  if (parley.location) fetch(parley.location, { method: "DELETE", keepalive: true }).catch(() => {});
});
setState("idle");
