// <parley-voice>: "talk to us" for any web page, with one tag and no build step.
//
//   <script type="module" src="https://voice.example/static/parley-widget.js"
//           data-token-url="/parley-token" data-label="Talk to us"></script>
//
// The script mounts one <parley-voice> from its own data attributes (unless the page already
// has one): data-gateway (default: where this script came from), data-token-url (the site's
// own endpoint that answers {"token": ...}; omit it for a gateway in open mode),
// data-position (bottom-right | bottom-left | top-right | top-left | inline), data-theme
// (auto | light | dark) and data-label. The element takes the same names as attributes.
//
// API: el.start(), el.stop(), el.muted = true; events "state" {state, message},
// "transcript" {text, final}, "response" {turn, text, heard, unheard, interrupted}.
// States: idle, connecting, listening, thinking, speaking, reconnecting, error.
//
// The call, its reconnects and barge-in playback are static/parley-call.js, the module the
// demo page uses too.

import { CallError, ParleyCall, splitHeard } from "./parley-call.js";

const SCRIPT_ORIGIN = new URL(import.meta.url).origin;
const MAX_CAPTIONS = 6; // the last few lines; the panel is small
const POSITIONS = ["bottom-right", "bottom-left", "top-right", "top-left", "inline"];
const THEMES = ["auto", "light", "dark"];

// What a caller reads for each refusal; the technical detail goes to the console.
const HUMAN_MESSAGES = {
  origin_not_allowed: "This website is not allowed to use this voice service.",
  token_expired: "This page's voice link has expired. Reload the page and try again.",
  invalid_token: "The voice service could not verify this website. Please try again later.",
  unauthorized: "The voice service could not verify this website. Please try again later.",
  unknown_flow: "This voice line is not available on this service. Please try again later.",
  token_unavailable: "This website could not start a call right now. Please try again later.",
  rate_limited: "Too many calls right now. Please wait a moment and try again.",
  too_many_sessions: "All lines are busy. Please try again in a moment.",
  engine_busy: "All lines are busy. Please try again in a moment.",
  draining: "The voice service is restarting. Please try again in a moment.",
  store_unavailable: "The voice service is having trouble. Please try again in a moment.",
  unreachable: "Cannot reach the voice service. Check your connection and try again.",
  microphone_denied: "Microphone access was denied. Allow it in your browser's site settings and try again.",
  no_microphone: "No microphone was found.",
  ice_failed: "The audio could not connect. Your network may block calls.",
  connection_lost: "The call dropped and could not be restored.",
};
const DEFAULT_MESSAGE = "Something went wrong with the call. Please try again.";
const STATUS_TEXT = {
  idle: "",
  connecting: "Connecting…",
  listening: "Listening",
  thinking: "Thinking…",
  speaking: "Speaking",
  reconnecting: "Reconnecting…",
  error: "The call could not go through",
};

const STYLE = `
:host { all: initial; font: 15px/1.4 system-ui, sans-serif; position: fixed; z-index: 2147483000;
  --accent: var(--parley-accent, #0b5fff); --accent-fg: #fff; --bg: #fff; --fg: #1b1f24; --muted: #57606a;
  --border: #d0d7de; --danger: #cf222e; --focus: #fb8c00; color: var(--fg); }
:host([data-theme="dark"]) { --bg: #161b22; --fg: #e6edf3; --muted: #9ea7b3; --border: #30363d; --accent-fg: #0d1117;
  --accent: var(--parley-accent, #4c8dff); }
@media (prefers-color-scheme: dark) {
  :host([data-theme="auto"]) { --bg: #161b22; --fg: #e6edf3; --muted: #9ea7b3; --border: #30363d; --accent-fg: #0d1117;
    --accent: var(--parley-accent, #4c8dff); }
}
:host([data-position="bottom-right"]) { right: 20px; bottom: 20px; }
:host([data-position="bottom-left"]) { left: 20px; bottom: 20px; }
:host([data-position="top-right"]) { right: 20px; top: 20px; }
:host([data-position="top-left"]) { left: 20px; top: 20px; }
:host([data-position="inline"]) { position: static; display: inline-block; }
.widget { display: flex; flex-direction: column; align-items: flex-end; gap: 8px; max-width: min(360px, 90vw); }
:host([data-position$="left"]) .widget { align-items: flex-start; }
.panel { background: var(--bg); border: 1px solid var(--border); border-radius: 12px; padding: 10px 12px;
  box-shadow: 0 4px 16px rgb(0 0 0 / 0.15); width: min(340px, 90vw); }
.panel[hidden] { display: none; }
.status { margin: 0; font-weight: 600; display: flex; align-items: center; gap: 8px; }
.status[hidden] { display: none; }
.dot { width: 10px; height: 10px; border-radius: 50%; background: var(--muted); flex: none; }
:host([data-state="listening"]) .dot { background: #1a7f37; }
:host([data-state="thinking"]) .dot { background: #bf8700; }
:host([data-state="speaking"]) .dot { background: var(--accent); }
:host([data-state="error"]) .dot { background: var(--danger); }
.error { margin: 6px 0 0; color: var(--danger); }
.error:empty { display: none; }
.captions { list-style: none; margin: 8px 0 0; padding: 0; max-height: 220px; overflow-y: auto; }
.captions:empty { display: none; }
.captions li { margin: 4px 0; padding: 6px 8px; border-radius: 8px; background: color-mix(in srgb, var(--fg) 6%, transparent); }
.captions li.assistant { background: color-mix(in srgb, var(--accent) 14%, transparent); }
.captions li.partial { color: var(--muted); font-style: italic; }
.captions li.partial .tentative { opacity: 0.6; }
.captions .who { display: block; font-size: 12px; color: var(--muted); }
.captions s { color: var(--muted); }
.controls { display: flex; gap: 8px; }
button { font: inherit; font-weight: 600; border-radius: 999px; border: 1px solid transparent; padding: 10px 16px;
  cursor: pointer; background: var(--accent); color: var(--accent-fg); box-shadow: 0 2px 8px rgb(0 0 0 / 0.2); }
button[hidden] { display: none; }
button.secondary { background: var(--bg); color: var(--fg); border-color: var(--border); }
button.hangup { background: var(--danger); color: #fff; }
button[aria-pressed="true"] { background: var(--fg); color: var(--bg); }
button:focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
@media (prefers-reduced-motion: no-preference) {
  :host([data-state="connecting"]) .dot, :host([data-state="reconnecting"]) .dot,
  :host([data-state="thinking"]) .dot { animation: pulse 1s ease-in-out infinite; }
  :host([data-state="speaking"]) .dot { animation: pulse 0.6s ease-in-out infinite; }
  button { transition: transform 0.1s; }
  button:active { transform: scale(0.97); }
}
@keyframes pulse { 50% { opacity: 0.3; } }
`;

function element(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key in node && !key.includes("-")) node[key] = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

export class ParleyVoice extends HTMLElement {
  static observedAttributes = ["label", "position", "theme"];

  constructor() {
    super();
    this.state = "idle";
    this.message = "";
    this._turnEnded = false;
    const root = this.attachShadow({ mode: "open" });
    this._status = element("p", { className: "status", role: "status", "aria-live": "polite" });
    this._statusText = element("span");
    this._status.append(element("span", { className: "dot", "aria-hidden": "true" }), this._statusText);
    this._error = element("p", { className: "error", role: "alert" });
    this._captions = element("ol", { className: "captions", "aria-label": "Live captions", "aria-live": "polite" });
    this._panel = element("div", { className: "panel", hidden: true }, this._status, this._error, this._captions);
    this._startButton = element("button", { type: "button", className: "start" });
    this._muteButton = element("button", { type: "button", className: "secondary mute", hidden: true,
      "aria-pressed": "false" }, "Mute");
    this._muteButton.setAttribute("aria-label", "Mute microphone");
    this._hangUpButton = element("button", { type: "button", className: "hangup", hidden: true }, "Hang up");
    this._hangUpButton.setAttribute("aria-label", "Hang up");
    this._audio = element("audio", { hidden: true });
    const controls = element("div", { className: "controls" }, this._muteButton, this._hangUpButton, this._startButton);
    root.append(element("style", {}, STYLE),
      element("div", { className: "widget", role: "region", "aria-label": "Voice assistant" },
        this._panel, controls, this._audio));
    this._startButton.addEventListener("click", () => this.start());
    this._hangUpButton.addEventListener("click", () => this.stop());
    this._muteButton.addEventListener("click", () => { this.muted = !this.muted; });
    root.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && this.call?.inCall) this.stop(); // Esc ends the call from any control
    });
  }

  connectedCallback() {
    this._render();
  }

  attributeChangedCallback() {
    this._render();
  }

  get gateway() {
    return this.getAttribute("gateway") || SCRIPT_ORIGIN;
  }

  get tokenUrl() {
    return this.getAttribute("token-url");
  }

  get label() {
    return this.getAttribute("label") || "Talk to us";
  }

  get muted() {
    return this._muteButton.getAttribute("aria-pressed") === "true";
  }

  set muted(value) {
    this._muteButton.setAttribute("aria-pressed", String(Boolean(value)));
    this._muteButton.textContent = value ? "Unmute" : "Mute";
    this._muteButton.setAttribute("aria-label", value ? "Unmute microphone" : "Mute microphone");
    this.call?.setMuted(Boolean(value));
  }

  // Place a call (from a click, or the page's own code).
  async start() {
    if (this.call?.inCall) return;
    this._captions.replaceChildren();
    this.muted = false;
    this.call = new ParleyCall({ gateway: this.gateway, audio: this._audio, cutOnBargeIn: true,
      authorize: () => this._fetchToken() });
    this._listen(this.call);
    await this.call.call();
  }

  async stop() {
    await this.call?.hangUp();
  }

  async _fetchToken() {
    if (!this.tokenUrl) return null; // a gateway in open mode needs none
    let response;
    try {
      response = await fetch(this.tokenUrl, { method: "POST", credentials: "same-origin" });
    } catch (err) {
      throw new CallError(`the token endpoint ${this.tokenUrl} is unreachable: ${err.message}`, { code: "token_unavailable" });
    }
    const body = await response.json().catch(() => null);
    if (!response.ok || typeof body?.token !== "string") {
      throw new CallError(`the token endpoint ${this.tokenUrl} answered HTTP ${response.status} without a token`,
        { code: "token_unavailable", status: response.status });
    }
    return body.token;
  }

  _listen(call) {
    call.addEventListener("state", ({ detail: { state } }) => {
      if (call !== this.call) return;
      if (state === "calling") this._setState("connecting");
      else if (state === "connected") this._setState(this._turnEnded ? "thinking" : "listening");
      else if (state === "reconnecting") this._setState("reconnecting");
      else if (state === "failed") this._setState("error", HUMAN_MESSAGES[call.errorCode] || DEFAULT_MESSAGE);
      else this._setState("idle");
    });
    call.addEventListener("gatewayevent", ({ detail: event }) => call === this.call && this._onEvent(event));
  }

  _onEvent(event) {
    const live = this.call.state === "connected";
    switch (event.type) {
      case "session.ready":
        this._turnEnded = false;
        if (live) this._setState("listening");
        break;
      case "transcript.partial": {
        const [settled, guess] = this._partialCaption().querySelectorAll("span + span");
        settled.textContent = event.text;
        guess.textContent = event.text && event.tentative ? ` ${event.tentative}` : event.tentative || "";
        this._emit("transcript", { text: event.text, tentative: event.tentative || "", final: false });
        break;
      }
      case "transcript.final":
        this._partial?.remove();
        this._partial = null;
        if (event.text) this._addCaption("user", "You", event.text);
        this._emit("transcript", { text: event.text, final: true });
        break;
      case "turn.end":
        this._turnEnded = true;
        if (live && this.state === "listening") this._setState("thinking");
        break;
      case "response.text.delta": {
        const item = this._assistantCaption(event.turn);
        item.dataset.text += event.delta;
        this._renderReply(item, false);
        break;
      }
      case "response.audio.start":
      case "response.continued":
        this._turnEnded = false;
        if (live) this._setState("speaking");
        break;
      case "response.paused":
      case "response.audio.end":
        if (live) this._setState("listening");
        break;
      case "response.interrupted": {
        const item = this._assistantCaption(event.turn);
        item.dataset.heard = event.heard_text ?? "";
        this._renderReply(item, true);
        if (live) this._setState("listening");
        break;
      }
    }
  }

  _setState(state, message = "") {
    this.state = state;
    this.message = message;
    this._render();
    this._emit("state", { state, message });
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail, bubbles: true, composed: true }));
  }

  _render() {
    const inCall = ["connecting", "listening", "thinking", "speaking", "reconnecting"].includes(this.state);
    const position = this.getAttribute("position");
    const theme = this.getAttribute("theme");
    this.dataset.position = POSITIONS.includes(position) ? position : "bottom-right";
    this.dataset.theme = THEMES.includes(theme) ? theme : "auto";
    this.dataset.state = this.state;
    // Keyboard users keep their place: focus follows the control that replaces the one used.
    const focused = this.shadowRoot.activeElement;
    this._startButton.hidden = inCall;
    this._muteButton.hidden = this._hangUpButton.hidden = !inCall;
    if (inCall && focused === this._startButton) this._hangUpButton.focus();
    if (!inCall && (focused === this._hangUpButton || focused === this._muteButton)) this._startButton.focus();
    this._startButton.textContent = this.state === "error" ? "Try again" : this.label;
    this._startButton.setAttribute("aria-label", `${this.state === "error" ? "Try again" : this.label}: start a voice call`);
    this._statusText.textContent = STATUS_TEXT[this.state] ?? "";
    this._status.hidden = this.state === "idle";
    this._error.textContent = this.state === "error" ? this.message : "";
    this._panel.hidden = this.state === "idle" && !this._captions.childElementCount;
  }

  _addCaption(kind, who, text) {
    const item = element("li", { className: kind }, element("span", { className: "who" }, who), element("span", {}, text));
    this._captions.insertBefore(item, this._partial?.isConnected ? this._partial : null); // partial words stay last
    while (this._captions.childElementCount > MAX_CAPTIONS) this._captions.firstElementChild.remove();
    this._captions.scrollTop = this._captions.scrollHeight;
    return item;
  }

  _partialCaption() {
    if (!this._partial?.isConnected) {
      this._partial = element("li", { className: "partial" }, element("span", { className: "who" }, "You"), element("span"),
        element("span", { className: "tentative" }));
      this._captions.append(this._partial);
    }
    return this._partial;
  }

  _assistantCaption(turn) {
    let item = this._captions.querySelector(`li.assistant[data-turn="${Number(turn)}"]`);
    if (!item) {
      item = this._addCaption("assistant", "Assistant", "");
      item.dataset.turn = String(Number(turn));
      item.dataset.text = "";
    }
    return item;
  }

  // The heard part of a reply in plain text, the unheard rest struck through.
  _renderReply(item, interrupted) {
    const { heard, unheard } = splitHeard(item.dataset.text, item.dataset.heard);
    const words = item.lastChild;
    words.replaceChildren(document.createTextNode(heard));
    if (unheard) words.append(" ", element("s", { title: "not heard" }, unheard));
    this._emit("response", { turn: Number(item.dataset.turn), text: item.dataset.text, heard, unheard, interrupted });
  }
}

if (!customElements.get("parley-voice")) customElements.define("parley-voice", ParleyVoice);

// One tag: the script's own data attributes mount the widget, unless the page placed one.
const script = [...document.querySelectorAll("script[src]")].find((s) => s.src === import.meta.url);
if (script && !document.querySelector("parley-voice")) {
  const widget = document.createElement("parley-voice");
  for (const name of ["gateway", "token-url", "position", "theme", "label"]) {
    const value = script.dataset[name.replace(/-(\w)/g, (_, c) => c.toUpperCase())];
    if (value) widget.setAttribute(name, value);
  }
  document.body.append(widget);
}
