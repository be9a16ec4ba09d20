// Parley call: one WebRTC call to the gateway with non-trickle signaling, and its reconnects.
// Shared by the demo page (static/demo.js) and the embeddable widget (static/parley-widget.js);
// each draws its own view from this object's events.
//
// Flow: microphone -> RTCPeerConnection (audio sendrecv + "events" data channel) -> wait for
// ICE gathering -> POST {gateway}/v1/calls (with the call token, when the page has one) ->
// apply the answer. The gateway reports on the data channel.
//
// A dropped connection (ICE failed, ICE disconnected for 3 s, no pong for 5 s, the events
// channel closing) or a session.migrate from a draining gateway starts a reconnect: a new
// RTCPeerConnection, the same microphone, and POST /v1/calls {resume_token, last_seq}, with
// backoff (1, 2, 4, 4, 4 s; 5 tries). The resume token admits the reconnect (a call token may
// have expired by then). The gateway replays the events missed.
//
// With `cutOnBargeIn`, the call plays Parley through WebAudio, so that it can cut a reply the
// caller talks over at once (playback.cut), and tells the gateway when each reply starts
// playing here (playout.started), the last stage of the turn's latency (see "playback" below).
//
// Events (EventTarget): "state" {state}, "gatewayevent" (each gateway event, once, in order),
// "failure" {message, code, status}, "connection" {text}, "microphone" {stream | null},
// "roundtrip" {ms}.

const ICE_GATHER_TIMEOUT_MS = 3000; // non-trickle: after this, send what has been gathered
const PING_INTERVAL_MS = 2000;
const HANGUP_TIMEOUT_MS = 3000;
const MAX_KEPT_EVENTS = 1000; // call.stats arrives every second or so; keep memory bounded
const PING_TIMEOUT_MS = 5000; // no pong for this long: the path is dead
const DISCONNECTED_GRACE_MS = 3000; // ICE "disconnected" often recovers by itself within this
const CONNECT_TIMEOUT_MS = 10000; // one reconnect try waits this long for "connected"
const RECONNECT_DELAYS_MS = [1000, 2000, 4000, 4000, 4000];
const FINAL_END_REASONS = ["replaced", "taken_over", "hangup", "assistant_ended", "idle", "stt_failed", "error"]; // session.ended: do not reconnect
const PLAYOUT_WATCH_MS = 10000; // a reply not heard within this after its response.audio.start is not reported
const CUT_FADE_S = 0.005;
const PLAYOUT_WORKLET_URL = new URL("./playout-onset.js", import.meta.url).href;

export const IN_CALL_STATES = ["calling", "connected", "reconnecting"];

// A refusal from the gateway or from the page's token endpoint: `code` is the gateway's error
// code (or a local one), so a view can explain it in words a caller understands.
export class CallError extends Error {
  constructor(message, { code = "call_failed", status = 0 } = {}) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

export class ParleyCall extends EventTarget {
  // gateway: the gateway's base URL ("" = this page's origin).
  // authorize: async () => call token or null; asked before each new call (not before a resume).
  // audio: the <audio> element that carries the remote stream.
  // cutOnBargeIn: play through WebAudio and cut replies the caller talks over.
  // audioConstraints: getUserMedia's audio constraints.
  constructor({ gateway = "", authorize = async () => null, audio, cutOnBargeIn = false, audioConstraints = true }) {
    super();
    this.gateway = gateway.replace(/\/+$/, "");
    this.authorize = authorize;
    this.audio = audio;
    this.cutOnBargeIn = cutOnBargeIn;
    this.audioConstraints = audioConstraints;
    // The public state (tests read it through window.parley on the demo page).
    this.state = "idle"; // idle | calling | connected | reconnecting | ended | failed
    this.events = [];
    this.error = null;
    this.errorCode = null;
    this.pc = null;
    this.location = null; // the call's URL, for DELETE
    this.ready = null; // the session.ready event
    this.sessionId = null;
    this.resumeToken = null; // never logged
    this.lastSeq = 0; // the highest event seq received; sent on resume so only missed events are replayed
    this.reconnects = 0; // successful reconnects in this session
    this.cuts = []; // turns whose playback this call cut (response.paused / .interrupted)
    // Private.
    this._localStream = null;
    this._pingTimer = null;
    this._nextPingId = 1;
    this._lastPongAt = 0;
    this._disconnectedTimer = null;
    this._attempt = 0; // bumped by every call() and every hang-up
    this._eventsChannel = null;
    // False on a resumed connection until its session.ready: the events before it are replays
    // of what was missed, and their replies are not playing now.
    this._eventsLive = false;
    this._playback = null; // {context, output, onset: Promise<AudioWorkletNode>, source, cutTurn}
    this._playoutTimer = null;
    this._pingsSent = new Map(); // id -> performance.now()
    // Free the gateway's session slot when the tab goes away; keepalive outlives the page.
    window.addEventListener("pagehide", () => {
      if (this.location) fetch(this.location, { method: "DELETE", keepalive: true }).catch(() => {});
    });
  }

  get inCall() {
    return IN_CALL_STATES.includes(this.state);
  }

  // Conversation playback: the AudioContext and the node whose output is what plays here.
  get playback() {
    return this._playback && { context: this._playback.context, output: this._playback.output };
  }

  get microphone() {
    return this._localStream;
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  _setState(state) {
    this.state = state;
    this._emit("state", { state });
  }

  _showConnection(pc) {
    this._emit("connection", {
      text: `(connection ${pc.connectionState}, ICE ${pc.iceConnectionState}, gathering ${pc.iceGatheringState})`,
    });
  }

  // -- placing a call ----------------------------------------------------------------------

  async call() {
    if (this.state === "calling" || this.state === "connected") return;
    const attempt = ++this._attempt;
    // Hanging up while a step is pending starts a new attempt; the old one then just stops.
    const superseded = () => attempt !== this._attempt;
    this.error = this.errorCode = null;
    this.events = [];
    this.ready = null;
    this.location = null;
    this.sessionId = this.resumeToken = null;
    this.lastSeq = this.reconnects = 0;
    this.cuts = [];
    this._setState("calling");
    try {
      const token = await this._callToken();
      if (superseded()) return;
      const stream = await openMicrophone(this.audioConstraints);
      if (superseded()) return stream.getTracks().forEach((track) => track.stop());
      this._localStream = stream;
      this._emit("microphone", { stream });
      this._eventsLive = true; // a new session: nothing to replay
      const pc = this._createPeerConnection(stream);
      await pc.setLocalDescription(await pc.createOffer());
      await iceGatheringComplete(pc, ICE_GATHER_TIMEOUT_MS);
      if (superseded()) return;
      logCandidates("local", pc.localDescription.sdp);
      const { answer, callUrl } = await this._postOffer({ sdp: pc.localDescription.sdp, type: "offer" }, token);
      if (superseded()) return deleteCall(callUrl); // the gateway answered a call nobody wants now
      this.location = callUrl;
      logCandidates("remote", answer.sdp);
      await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    } catch (err) {
      if (!superseded()) await this._fail(err);
    }
  }

  async _callToken() {
    try {
      return await this.authorize();
    } catch (err) {
      if (err instanceof CallError) throw err;
      throw new CallError(`Could not get a call token: ${err.message || err}`, { code: "token_unavailable" });
    }
  }

  _createPeerConnection(stream) {
    // No STUN/TURN: the gateway offers its own reachable host candidates.
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    const [track] = stream.getAudioTracks();
    pc.addTransceiver(track, { direction: "sendrecv", streams: [stream] });
    // The gateway only adopts a channel the client opened, and it must be in the offer.
    this._eventsChannel = pc.createDataChannel("events");
    this._openEventsChannel(pc, this._eventsChannel);
    pc.ontrack = (event) => this._playRemote(event.streams[0] || new MediaStream([event.track]));
    pc.onconnectionstatechange = () => this._onConnectionState(pc);
    pc.oniceconnectionstatechange = () => {
      console.debug("parley: ICE", pc.iceConnectionState);
      this._showConnection(pc);
      this._watchDisconnected(pc);
    };
    pc.onicegatheringstatechange = () => this._showConnection(pc);
    pc.onicecandidateerror = (e) => console.debug("parley: candidate error", e.errorCode, e.errorText, e.url);
    this._showConnection(pc);
    return pc;
  }

  async _postOffer(offer, token) {
    const headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    let response;
    try {
      response = await fetch(`${this.gateway}/v1/calls`, { method: "POST", headers, body: JSON.stringify(offer) });
    } catch (err) {
      // A refused CORS preflight looks the same as an unreachable gateway from here.
      throw new CallError(`Cannot reach the gateway at ${this.gateway || location.origin}: ${err.message}`,
        { code: "unreachable" });
    }
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const detail = body?.error ? `${body.error.message} (${body.error.code})` : response.statusText;
      throw new CallError(`The gateway refused the call: HTTP ${response.status}: ${detail}`,
        { code: body?.error?.code || "http_error", status: response.status });
    }
    this.sessionId = body.session_id;
    this.resumeToken = body.resume_token;
    // A 307 from a draining gateway lands on a peer: calls live at the URL that answered.
    const callUrl = new URL(response.headers.get("Location") || `/v1/calls/${body.call_id}`, response.url).href;
    return { answer: body, callUrl };
  }

  _playRemote(stream) {
    this.audio.srcObject = stream;
    // autoplay may be blocked without a gesture; the Call click normally counts as one.
    this.audio.play().catch((err) => console.debug("parley: remote audio play():", err.message));
    if (this.cutOnBargeIn) this._playThroughOutput(stream);
  }

  async _onConnectionState(pc) {
    this._showConnection(pc);
    if (this.pc !== pc) return;
    if (pc.connectionState === "connected") {
      if (this.state !== "reconnecting") this._setState("connected");
    } else if (pc.connectionState === "failed" && this.state === "connected") {
      this._reconnect("the connection failed");
    } else if (pc.connectionState === "failed" && this.state === "calling") {
      await this._fail(new CallError(
        `ICE failed: no working network path to the gateway (ICE state ${pc.iceConnectionState}).`,
        { code: "ice_failed" }));
    }
  }

  _watchDisconnected(pc) {
    clearTimeout(this._disconnectedTimer);
    if (pc.iceConnectionState !== "disconnected") return;
    this._disconnectedTimer = setTimeout(() => {
      if (this.pc === pc && pc.iceConnectionState === "disconnected" && this.state === "connected") {
        this._reconnect("ICE stayed disconnected");
      }
    }, DISCONNECTED_GRACE_MS);
  }

  // -- the events data channel -------------------------------------------------------------

  _openEventsChannel(pc, channel) {
    channel.onopen = () => {
      this._lastPongAt = performance.now();
      this._sendPing(channel);
      clearInterval(this._pingTimer);
      this._pingTimer = setInterval(() => {
        if (performance.now() - this._lastPongAt > PING_TIMEOUT_MS && this.pc === pc && this.state === "connected") {
          return this._reconnect("no pong from the gateway");
        }
        this._sendPing(channel);
      }, PING_INTERVAL_MS);
    };
    channel.onmessage = (message) => this._onEvent(parseEvent(message.data));
    channel.onclose = () => {
      if (this.pc !== pc) return;
      clearInterval(this._pingTimer);
      // Without a session.ended first, a closing channel means the call dropped (a node
      // died or restarted): the session lives on, so resume it.
      if (this.state === "connected") this._reconnect("the events channel closed");
    };
  }

  _onEvent(event) {
    if (!event) return console.warn("parley: ignoring a malformed event");
    if (typeof event.seq === "number") {
      if (event.seq <= this.lastSeq) return; // already seen (a replay overlapping what arrived)
      this.lastSeq = event.seq;
    }
    this.events.push(event);
    if (this.events.length > MAX_KEPT_EVENTS) this.events.splice(0, this.events.length - MAX_KEPT_EVENTS);
    switch (event.type) {
      case "session.ready":
        this.ready = event;
        this._eventsLive = true;
        console.debug(`parley: session ready, mode ${event.mode}`);
        break;
      case "pong":
        this._lastPongAt = performance.now();
        this._showRoundTrip(event.ping_id);
        break;
      case "session.migrate": // the gateway is draining: move to another node now
        this.resumeToken = event.resume_token;
        this._reconnect("the gateway asked to migrate", 0);
        break;
      case "session.ended":
        if (FINAL_END_REASONS.includes(event.reason)) this._endCall(`The call ended (${event.reason}).`);
        break;
      case "error":
        this._showError(`Gateway error: ${event.message} (${event.code})`, event.code);
        break;
      case "response.paused":
        if (this._eventsLive) this._cutPlayback(event.turn);
        break;
      case "response.continued":
        this._openPlayback();
        break;
      case "response.interrupted":
        if (this._eventsLive) this._cutPlayback(event.turn);
        break;
      case "response.audio.start":
        this._openPlayback();
        if (this._eventsLive) this._armPlayout(event.turn);
        break;
    }
    this._emit("gatewayevent", event);
  }

  _sendPing(channel) {
    if (channel.readyState !== "open") return;
    const id = this._nextPingId++;
    this._pingsSent.set(id, performance.now());
    channel.send(JSON.stringify({ type: "ping", id }));
  }

  _showRoundTrip(id) {
    const sentAt = this._pingsSent.get(id);
    if (sentAt === undefined) return;
    this._pingsSent.delete(id);
    this._emit("roundtrip", { ms: performance.now() - sentAt });
  }

  _showError(message, code) {
    this.error = message;
    this.errorCode = code;
    console.warn("parley:", message);
    this._emit("failure", { message, code });
  }

  // -- playback (cutOnBargeIn) ---------------------------------------------------------------

  // Parley plays through WebAudio: remote stream -> `output` gain -> speakers. The <audio>
  // element keeps the stream attached but muted (Chromium feeds a remote WebRTC stream to
  // WebAudio only while a media element plays it); if the AudioContext cannot run (an
  // autoplay policy), the element plays instead. Owning the output serves two things:
  //
  // Barge-in. When the gateway pauses or interrupts a reply for the caller (response.paused,
  // response.interrupted), the audio it sent last is still on its way: the network and this
  // browser's jitter buffer hold ~100 ms of it. The call cuts it at once (a CUT_FADE_S fade,
  // so no click), tells the gateway (playback.cut {turn}: a reply that plays on is rewound by
  // what was cut, and an interrupted one counts only what was heard), and opens again on
  // response.continued or the next reply's response.audio.start.
  //
  // Playout start. The gateway knows when it sent a reply's first frame, not when it began to
  // play here. An AudioWorklet (static/playout-onset.js) on `output`, what plays here, hears
  // the first sound after response.audio.start; the call sends playout.started {turn} and the
  // gateway times that last stage on its own clock (the two clocks differ), from its first
  // frame to this report's arrival. Not RTCRtpReceiver.getSynchronizationSources()
  // .audioLevel: it describes packets as they arrive (before the jitter buffer), and only from
  // an audio-level header extension that Parley's sender does not write. Not an AnalyserNode
  // polled by a timer: timers run late on a busy main thread and barely at all in a background tab.

  _startPlayback() {
    const context = new AudioContext({ latencyHint: "interactive" });
    context.resume().catch(() => {});
    const output = context.createGain();
    output.connect(context.destination);
    const onset = context.audioWorklet.addModule(PLAYOUT_WORKLET_URL).then(() => {
      const worklet = new AudioWorkletNode(context, "playout-onset");
      worklet.port.onmessage = (message) => this._reportPlayout(message.data.turn);
      const mute = context.createGain(); // rendered, so that it runs, but silent
      mute.gain.value = 0;
      output.connect(worklet).connect(mute).connect(context.destination);
      return worklet;
    });
    // The element plays only while the context cannot (both at once would double the audio).
    const muteElementWhileContextRuns = () => { this.audio.muted = context.state === "running"; };
    context.onstatechange = muteElementWhileContextRuns;
    muteElementWhileContextRuns();
    return { context, output, onset, source: null, cutTurn: null };
  }

  // A new remote stream (the call, or a reconnect) goes into the same output.
  _playThroughOutput(stream) {
    this._playback ??= this._startPlayback();
    this._playback.source?.disconnect();
    this._playback.source = this._playback.context.createMediaStreamSource(stream);
    this._playback.source.connect(this._playback.output);
  }

  _cutPlayback(turn) {
    if (!this._playback || this._playback.cutTurn === turn) return;
    this._playback.cutTurn = turn;
    this.cuts.push(turn);
    this._setPlaybackGain(0);
    this._send({ type: "playback.cut", turn });
  }

  _openPlayback() {
    if (!this._playback || this._playback.cutTurn === null) return;
    this._playback.cutTurn = null;
    this._setPlaybackGain(1);
  }

  _setPlaybackGain(value) {
    const { context, output } = this._playback;
    this.audio.volume = value; // (what plays while the context cannot run)
    const now = context.currentTime;
    output.gain.cancelScheduledValues(now);
    output.gain.setValueAtTime(output.gain.value, now);
    output.gain.linearRampToValueAtTime(value, now + CUT_FADE_S);
  }

  _armPlayout(turn) {
    if (!this._playback) return;
    const tell = (message) => this._playback?.onset.then((node) => node.port.postMessage(message)).catch(() => {});
    tell({ turn });
    clearTimeout(this._playoutTimer);
    this._playoutTimer = setTimeout(() => tell({ turn: null }), PLAYOUT_WATCH_MS);
  }

  _reportPlayout(turn) {
    clearTimeout(this._playoutTimer);
    this._send({ type: "playout.started", turn });
  }

  _send(message) {
    if (this._eventsChannel?.readyState === "open") this._eventsChannel.send(JSON.stringify(message));
  }

  _stopPlayback() {
    clearTimeout(this._playoutTimer);
    this._playback?.context.close().catch(() => {});
    this._playback = null;
    this.audio.muted = false;
    this.audio.volume = 1;
  }

  // -- muting --------------------------------------------------------------------------------

  // Muting stops sending the caller's voice (the track stays open, so unmuting is instant).
  setMuted(muted) {
    for (const track of this._localStream?.getAudioTracks() ?? []) track.enabled = !muted;
  }

  // -- reconnecting ------------------------------------------------------------------------

  async _reconnect(why, firstDelayMs = RECONNECT_DELAYS_MS[0]) {
    if (this.state !== "connected" || !this.resumeToken) return;
    console.info(`parley: reconnecting: ${why}`);
    this._setState("reconnecting");
    this._emit("connection", { text: "reconnecting…" });
    const attempt = ++this._attempt;
    this._closePeer(this._dropPeer());
    for (let i = 0; i < RECONNECT_DELAYS_MS.length; i++) {
      await sleep(i === 0 ? firstDelayMs : RECONNECT_DELAYS_MS[i]);
      if (attempt !== this._attempt) return; // hung up meanwhile
      try {
        await this._resumeOnce(attempt);
        if (attempt !== this._attempt) return;
        this.reconnects++;
        this._setState("connected");
        return;
      } catch (err) {
        if (attempt !== this._attempt) return;
        this._closePeer(this._dropPeer());
        console.warn(`parley: reconnect try ${i + 1} failed: ${err.message}`);
        if (err.status === 401 || err.status === 404) {
          return this._fail(new CallError(`The session cannot be resumed: ${err.message}`, err));
        }
      }
    }
    await this._fail(new CallError("The connection to the gateway was lost and could not be restored.",
      { code: "connection_lost" }));
  }

  async _resumeOnce(attempt) {
    this._eventsLive = false; // until this connection's session.ready
    const pc = this._createPeerConnection(this._localStream);
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, ICE_GATHER_TIMEOUT_MS);
    if (attempt !== this._attempt) return;
    const { answer, callUrl } = await this._postOffer({
      sdp: pc.localDescription.sdp, type: "offer", resume_token: this.resumeToken, last_seq: this.lastSeq,
    }, null);
    if (attempt !== this._attempt) return deleteCall(callUrl);
    this.location = callUrl;
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    await connected(pc, CONNECT_TIMEOUT_MS);
  }

  // -- ending a call -----------------------------------------------------------------------

  // Stops pings and detaches the peer connection, so its late events are ignored; the
  // microphone stays open (a reconnect reuses it). Returns the connection, still open.
  _dropPeer() {
    clearInterval(this._pingTimer);
    clearTimeout(this._disconnectedTimer);
    this._pingsSent.clear();
    const pc = this.pc;
    this.pc = null;
    this.location = null;
    return pc;
  }

  // Stops capture, playback and pings at once and detaches the peer connection.
  _detachCall() {
    this._attempt++;
    this._stopPlayback();
    this._localStream?.getTracks().forEach((track) => track.stop());
    this._localStream = null;
    this._emit("microphone", { stream: null });
    this.audio.srcObject = null;
    return this._dropPeer();
  }

  _closePeer(pc) {
    if (!pc) return;
    pc.close();
    this._showConnection(pc);
  }

  _takeCallUrl() {
    const url = this.location;
    this.location = null;
    return url;
  }

  async hangUp() {
    if (!this.inCall) return;
    const callUrl = this._takeCallUrl();
    const pc = this._detachCall(); // silent at once
    this._setState("ended");
    // DELETE before closing, so the gateway ends the call as a hang-up rather than noticing a
    // dropped connection; the timeout keeps an unreachable gateway from holding the close.
    await deleteCall(callUrl);
    this._closePeer(pc);
  }

  _endCall(reason) {
    this._takeCallUrl(); // the gateway has already forgotten the call
    this._closePeer(this._detachCall());
    this._emit("connection", { text: reason });
    this._setState("ended");
  }

  async _fail(err) {
    const callUrl = this._takeCallUrl();
    this._showError(err.message || String(err), err.code || "call_failed");
    this._closePeer(this._detachCall());
    this._setState("failed");
    await deleteCall(callUrl);
  }
}

// -- helpers ---------------------------------------------------------------------------------

async function openMicrophone(audioConstraints) {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new CallError("This browser cannot capture audio here (getUserMedia needs HTTPS or localhost).",
      { code: "no_microphone" });
  }
  try {
    return await navigator.mediaDevices.getUserMedia({ audio: audioConstraints, video: false });
  } catch (err) {
    if (err.name === "NotAllowedError") {
      throw new CallError("Microphone access was denied. Allow it in the browser's site settings and call again.",
        { code: "microphone_denied" });
    }
    if (err.name === "NotFoundError") throw new CallError("No microphone was found.", { code: "no_microphone" });
    throw new CallError(`Cannot open the microphone: ${err.name}: ${err.message}`, { code: "no_microphone" });
  }
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

function parseEvent(data) {
  try {
    const event = JSON.parse(data);
    return event && typeof event.type === "string" ? event : null;
  } catch {
    return null;
  }
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

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The words of a reply the caller heard, and the unheard rest (struck through by a view).
export function splitHeard(text, heardText) {
  const words = text.split(/\s+/).filter(Boolean);
  if (heardText === undefined || heardText === null) return { heard: words.join(" "), unheard: "" };
  const heardWords = heardText.split(/\s+/).filter(Boolean).length;
  return { heard: words.slice(0, heardWords).join(" "), unheard: words.slice(heardWords).join(" ") };
}
