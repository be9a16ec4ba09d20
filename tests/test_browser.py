"""A real Chromium calls the demo page in echo-test mode and hears its own chirps back.

Chromium's fake microphone plays a WAV of test chirps; the page records the remote audio
(the echo) through WebAudio, and the test finds the chirps in that recording. This covers
the parts the aiortc test cannot: the demo page and script, browser ICE/DTLS/SCTP against
aiortc, and Chromium's Opus.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np
import pytest
from playwright.async_api import async_playwright

from tests.conftest import missing
from tests.kit.browser import CHROMIUM, chromium_args
from tests.kit.signals import chirp_sequence, find_signal, match_chirps, resample, write_wav

RATE = 48000
ECHO_DELAY_MS = 300
# Chromium's fake microphone starts the file when getUserMedia opens, and what it captures
# before the call connects is lost; this much silence first keeps the chirps after that.
LEAD_IN_S = 1.5
MIN_CHIRPS_FOUND = 3  # of 6: half the chirps back intact and in place (noise or silence finds none)
CHIRP_MATCH = 0.5  # normalized correlation of one chirp (different chirps correlate < 0.2)
DELAY_SPREAD_S = 0.15  # adaptive playout (both jitter buffers) shifts chirps by tens of ms
WAIT_MS = 30_000  # generous: a loaded 2-core machine runs Chromium and the gateway together
SCREENSHOT = Path("/tmp/parley_demo.png")


@pytest.fixture(autouse=True)
def chromium() -> None:
    if not CHROMIUM.exists():
        missing(f"needs Chromium at {CHROMIUM} (apt-get install chromium; `make test` does)")


# Records whatever the <audio id=remote> element is given, from the moment it has a stream.
# An AudioWorklet copies each 128-sample render quantum; the worklet's output goes nowhere
# audible (gain 0) but keeps the node in the rendered graph.
START_RECORDER = """
async () => {
  const rec = window.__recorder = {chunks: [], length: 0, rate: 0, started: false, error: null};
  const context = new AudioContext();
  await context.resume();
  rec.rate = context.sampleRate;
  const processor = `registerProcessor("tap", class extends AudioWorkletProcessor {
    process(inputs) {
      const channel = inputs[0] && inputs[0][0];
      this.port.postMessage(channel ? channel.slice() : new Float32Array(128));
      return true;
    }
  });`;
  const url = URL.createObjectURL(new Blob([processor], {type: "text/javascript"}));
  await context.audioWorklet.addModule(url);
  const remote = document.getElementById("remote");
  const timer = setInterval(() => {
    if (!remote.srcObject) return;
    clearInterval(timer);
    try {
      const source = context.createMediaStreamSource(remote.srcObject);
      const tap = new AudioWorkletNode(context, "tap", {channelCount: 1, channelCountMode: "explicit"});
      const mute = context.createGain();
      mute.gain.value = 0;
      tap.port.onmessage = (e) => { rec.chunks.push(e.data); rec.length += e.data.length; };
      source.connect(tap).connect(mute).connect(context.destination);
      rec.started = true;
    } catch (err) {
      rec.error = String(err);
    }
  }, 10);
  return rec.rate;
}
"""

# The recording as base64 little-endian float32 (far smaller than a JSON array of numbers).
FETCH_RECORDING = """
() => {
  const rec = window.__recorder;
  const all = new Float32Array(rec.length);
  let at = 0;
  for (const chunk of rec.chunks) { all.set(chunk, at); at += chunk.length; }
  const bytes = new Uint8Array(all.buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}
"""


# A microphone the test speaks into when something happens on the page, instead of Chromium's
# fake one, which starts its file when getUserMedia opens: whatever the file says comes at a
# fixed time after that, however late the call connects or the reply starts on a busy machine.
# window.__microphone.sayOn(type, when, base64 float32, rate) speaks the samples once, at the
# first gateway event of `type` for which `when(event)` holds; silence before and after.
SCRIPTED_MICROPHONE = """
(() => {
  const context = new AudioContext({ sampleRate: 48000 });
  const line = context.createMediaStreamDestination();
  const mic = window.__microphone = { armed: false, startedAt: null, endedAt: null, trigger: null };
  mic.say = (base64, rate) => {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const samples = new Float32Array(bytes.buffer);
    const buffer = context.createBuffer(1, samples.length, rate);
    buffer.copyToChannel(samples, 0);
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(line);
    source.onended = () => { mic.endedAt = performance.now(); };
    source.start();
    mic.startedAt = performance.now();
  };
  mic.sayOn = (call, type, when, base64, rate) => {
    mic.armed = true;
    const listener = (e) => {
      if (e.detail.type !== type || !when(e.detail)) return;
      call.removeEventListener("gatewayevent", listener);
      mic.trigger = e.detail;
      mic.say(base64, rate);
    };
    call.addEventListener("gatewayevent", listener);
  };
  navigator.mediaDevices.getUserMedia = async () => {
    await context.resume();
    return new MediaStream(line.stream.getAudioTracks().map((track) => track.clone()));
  };
})();
"""


def float32_base64(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<f4").tobytes()).decode()


@contextlib.asynccontextmanager
async def demo_page(wav: Path) -> AsyncIterator[tuple[Any, list[str]]]:
    """Headless Chromium with `wav` as its microphone: (a page, its console lines). The
    console is printed if the test fails inside the block."""
    console: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=chromium_args(wav))
        try:
            page = await browser.new_page()
            page.on("console", lambda message: console.append(f"[{message.type}] {message.text}"))
            page.on("pageerror", lambda error: console.append(f"[pageerror] {error}"))
            page.set_default_timeout(WAIT_MS)
            try:
                yield page, console
            except BaseException:
                print("\n".join(["browser console:", *console]))
                raise
        finally:
            await browser.close()


async def wait_for_no_calls(gateway, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while gateway.registry.calls and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def test_browser_echo_call(start_gateway, tmp_path):
    signal = chirp_sequence(RATE)  # match_chirps knows its layout
    wav = tmp_path / "chirps.wav"
    write_wav(wav, np.concatenate([np.zeros(round(LEAD_IN_S * RATE), np.float32), signal]), RATE)
    gateway = await start_gateway(echo_delay_ms=ECHO_DELAY_MS, stats_interval_s=0.5)
    async with demo_page(wav) as (page, console):
        await page.goto(f"{gateway.url}/?processing=off")
        await page.wait_for_function("window.parley && window.parley.state === 'idle'")
        assert "Echo test" in await page.inner_text("#mode-banner")
        assert f"{ECHO_DELAY_MS} ms" in await page.inner_text("#mode-banner")
        rate = int(await page.evaluate(START_RECORDER))

        await page.click("#call")
        await page.wait_for_function("['connected', 'failed'].includes(window.parley.state)")
        state, error = await page.evaluate("[window.parley.state, window.parley.error]")
        assert state == "connected", f"call did not connect: {error}"
        await page.wait_for_function("window.__recorder.started || window.__recorder.error")
        assert await page.evaluate("window.__recorder.error") is None

        # Count from the connection, as the file may start only now: the whole file,
        # the echo delay and a margin for jitter and pacing.
        needed = round((LEAD_IN_S + len(signal) / RATE + ECHO_DELAY_MS / 1000 + 1.5) * rate)
        await page.wait_for_function(
            "n => window.__recorder.error || window.__recorder.length >= n",
            arg=await page.evaluate("window.__recorder.length") + needed,
            timeout=WAIT_MS + needed / rate * 1000)
        assert await page.evaluate("window.__recorder.error") is None
        await page.wait_for_function(
            "window.parley.events.some(e => e.type === 'call.stats')"
            " && document.querySelector('[data-stat=\"jitter.packets_received\"]').textContent !== '—'")
        await page.screenshot(path=str(SCREENSHOT), full_page=True)

        parley = await page.evaluate(
            "({error: window.parley.error, events: window.parley.events})")
        recording = np.frombuffer(base64.b64decode(await page.evaluate(FETCH_RECORDING)),
                                  dtype="<f4")

        async with page.expect_response(lambda r: r.request.method == "DELETE") as hang_up:
            await page.click("#hangup")
        assert (await hang_up.value).status == 204
        await page.wait_for_function("window.parley.state === 'ended'")
        await wait_for_no_calls(gateway)
        assert not gateway.registry.calls, "hang-up left the call open on the gateway"

    assert parley["error"] is None
    ready = [e for e in parley["events"] if e["type"] == "session.ready"]
    assert ready and ready[0]["mode"] == "echo-test" and ready[0]["echo_delay_ms"] == ECHO_DELAY_MS
    stats = [e for e in parley["events"] if e["type"] == "call.stats"]
    assert stats and stats[-1]["jitter"]["packets_received"] > 0

    recorded = resample(recording, rate, 16000)
    reference = resample(signal, RATE, 16000)
    # Chromium's NetEq and the gateway's jitter buffer may stretch or shrink playout by tens of
    # milliseconds during a call, which ruins a single alignment of the whole sequence (it
    # measured 0.16-0.99 here), so each chirp is found on its own; the whole match is printed only.
    _, whole = find_signal(reference, recorded)
    chirps = match_chirps(reference, recorded, 16000)
    found = [delay for delay, match in chirps if match > CHIRP_MATCH]
    print(f"browser echo: whole-sequence match={whole:.3f}; per chirp (delay s, ncc) "
          + ", ".join(f"({d:.3f}, {m:.2f})" for d, m in chirps)
          + f"; recorded {len(recording) / rate:.2f} s at {rate} Hz; {len(stats)} call.stats events;"
          f" last jitter {stats[-1]['jitter']}, pacer {stats[-1]['pacer']}")
    assert len(found) >= MIN_CHIRPS_FOUND, f"the echo lacks the chirps: {len(found)} of {len(chirps)} found"
    assert max(found) - min(found) <= DELAY_SPREAD_S, f"chirps came back out of place: {chirps}"


async def test_browser_reconnects_and_resumes_its_session(start_gateway, tmp_path):
    """The demo page resumes its session by itself: after a session.migrate, and after the
    gateway drops the call without a word (as a dying node would)."""
    wav = tmp_path / "silence.wav"
    write_wav(wav, np.zeros(RATE, np.float32), RATE)
    gateway = await start_gateway(stats_interval_s=0.5)

    async def current_call(previous=None):
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:
            calls = list(gateway.registry.by_session.values())
            if calls and calls[0] is not previous and calls[0].pc.connectionState == "connected":
                return calls[0]
            assert time.monotonic() < deadline, "no new connected call on the gateway"
            await asyncio.sleep(0.05)

    async with demo_page(wav) as (page, console):
        await page.goto(gateway.url)
        await page.wait_for_function("window.parley && window.parley.state === 'idle'")
        await page.click("#call")
        # Connected media is not yet an open events channel: a migrate sent before it opens is lost.
        await page.wait_for_function("window.parley.state === 'connected' && window.parley.ready !== null")
        first = await current_call()
        session_id = await page.evaluate("window.parley.sessionId")
        assert first.session_id == session_id

        await gateway.registry.migrate(first)  # a draining node asks the client to move
        await page.wait_for_function("window.parley.reconnects === 1 && window.parley.state === 'connected'")
        second = await current_call(first)
        assert second.session_id == session_id and second.resumed

        await second.close("peer_timeout")  # dropped without session.ended
        await page.wait_for_function("window.parley.reconnects === 2 && window.parley.state === 'connected'")
        third = await current_call(second)
        assert third.session_id == session_id and third.resumed
        await page.wait_for_function(
            "window.parley.events.filter(e => e.type === 'session.ready').length === 3")
        events = await page.evaluate("window.parley.events")
        assert "reconnecting" in "\n".join(console)
        async with page.expect_response(lambda r: r.request.method == "DELETE") as hang_up:
            await page.click("#hangup")
        assert (await hang_up.value).status == 204
        await wait_for_no_calls(gateway)
        assert not gateway.registry.calls

    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)), "events arrive once each, in order, across reconnects"
    ready = [e for e in events if e["type"] == "session.ready"]
    assert [e["resumed"] for e in ready] == [False, True, True]
    assert all(e["session_id"] == session_id for e in ready)
    assert third.playout.last_packet_at is not None, "the microphone reaches the resumed call"


async def test_browser_conversation_view(start_gateway, tmp_path, http):
    """The demo page in conversation mode: the caller's words, the reply and the latency
    waterfall appear as the turn happens (speech from a held-out voice as the microphone),
    and the page reports when the reply starts playing: the waterfall's last stage."""
    from engine.wavfile import read_wav
    from tests.test_conversation_call import conversation_engine
    from tests.kit.metrics import scrape
    from tests.test_stt_shipped import SPEECH

    speech = read_wav(SPEECH / "flite_slt-020.wav", 16000).astype(np.float32)
    speech = speech / 32768 if np.abs(speech).max() > 1 else speech
    wav = tmp_path / "caller.wav"
    write_wav(wav, np.concatenate([np.zeros(round(LEAD_IN_S * RATE), np.float32), resample(speech, 16000, RATE),
                                   np.zeros(RATE * 3, np.float32)]), RATE)
    gateway = await start_gateway(mode="conversation", responder="echo", speech_engine=conversation_engine())
    async with demo_page(wav) as (page, console):
        await page.goto(f"{gateway.url}/?processing=off")
        assert "Conversation" in await page.inner_text("#mode-banner")
        await page.click("#call")
        await page.wait_for_function("window.parley.state === 'connected'")
        await page.wait_for_selector("#dialog li.user")
        await page.wait_for_selector("#dialog li.assistant")
        await page.wait_for_function(
            "document.querySelector('#dialog li.assistant').textContent.startsWith('You said:')")
        await page.wait_for_selector("#waterfall tbody tr")
        row = await page.inner_text("#waterfall tbody tr")
        assert row.split()[0] == "1" or row.split()[0] == "2"

        await page.wait_for_function(
            "window.parley.events.some(e => e.type === 'metrics.turn' && 'browser_playout_ms' in e)")
        events = await page.evaluate("window.parley.events")
        playout = next(e for e in events if e["type"] == "metrics.turn" and "browser_playout_ms" in e)
        started = [e["turn"] for e in events if e["type"] == "response.audio.start"]
        assert playout["turn"] in started and playout["browser_playout_ms"] > 0
        stage = f'#waterfall tr[data-turn="{playout["turn"]}"] .stage.browser_playout_ms'
        assert await page.get_attribute(stage, "title") == f"browser playout: {playout['browser_playout_ms']} ms"
        assert not [e for e in events if e["type"] == "error"]
        samples = await scrape(http, gateway.url)
        assert samples["parley_turn_stage_seconds_count{stage=browser_playout}"] >= 1
        print(f"browser playout stage: {playout}")
        # A partial's settled words, then its tentative ones, fainter; as text, never HTML
        await page.evaluate("""window.parley.dispatchEvent(new CustomEvent("gatewayevent", {detail:
            {type: "transcript.partial", text: "I would", tentative: "like <b>two</b>"}}))""")
        assert await page.inner_text("#partial") == "I would like <b>two</b>"
        assert await page.inner_text("#partial .tentative") == " like <b>two</b>"
        assert await page.evaluate("getComputedStyle(document.querySelector('#partial .tentative')).opacity") == "0.6"
        await page.click("#hangup")
        await page.wait_for_function("window.parley.state === 'ended'")


async def test_browser_cuts_a_reply_the_caller_talks_over(start_gateway, tmp_path, http):
    """The caller talks over the greeting: the page cuts its playback on response.paused (or
    .interrupted) instead of letting the ~100 ms already on its way play out, tells the
    gateway (playback.cut), and plays the reply to the caller's words again.

    The caller speaks when the greeting is playing on the page (the gateway's metrics.turn
    with browser_playout_ms: the page heard its first sound), not at a fixed time after the
    microphone opened: on a loaded machine the call or the greeting can start late enough for
    fixed-time words to come before the greeting, or to be lost before the call connects."""
    from engine.wavfile import read_wav
    from tests.test_conversation_call import conversation_engine
    from tests.test_stt_shipped import SPEECH

    speech = read_wav(SPEECH / "flite_slt-020.wav", 16000).astype(np.float32)
    speech = speech / 32768 if np.abs(speech).max() > 1 else speech
    silent = tmp_path / "silence.wav"  # (Chromium's fake microphone, unused: the scripted one replaces it)
    write_wav(silent, np.zeros(RATE, np.float32), RATE)
    gateway = await start_gateway(mode="conversation", responder="scripted", speech_engine=conversation_engine())
    async with demo_page(silent) as (page, console):
        await page.add_init_script(SCRIPTED_MICROPHONE)
        await page.goto(f"{gateway.url}/?processing=off")
        await page.wait_for_function("window.parley && window.__microphone")
        await page.evaluate(
            "([audio, rate]) => window.__microphone.sayOn(window.parley, 'metrics.turn',"
            " (e) => 'browser_playout_ms' in e, audio, rate)", [float32_base64(speech), 16000])
        await page.click("#call")
        await page.wait_for_function("window.parley.state === 'connected'")
        await page.wait_for_function("window.__microphone.startedAt !== null")
        heard = await page.evaluate("window.__microphone.trigger.turn")
        greeting = next(e["turn"] for e in await page.evaluate("window.parley.events")
                        if e["type"] == "response.audio.start")
        assert heard == greeting, "the caller speaks over the greeting (8 s long), once it plays on the page"
        await page.wait_for_function("window.parley.cuts.length > 0")
        events = await page.evaluate("window.parley.events")
        cut = await page.evaluate("window.parley.cuts[0]")
        assert cut == greeting, "the caller's words came over the greeting"
        assert any(e["type"] in ("response.paused", "response.interrupted") and e["turn"] == cut for e in events)
        await page.wait_for_function("window.parley.playback.output.gain.value === 0")

        # The caller's turn gets its reply, and the page plays it: its playout is reported.
        await page.wait_for_function(
            f"window.parley.events.some(e => e.type === 'response.audio.start' && e.turn > {cut})")
        await page.wait_for_function("window.parley.playback.output.gain.value === 1")
        await page.wait_for_function(
            f"window.parley.events.some(e => e.type === 'metrics.turn' && e.turn > {cut} && 'browser_playout_ms' in e)")
        events = await page.evaluate("window.parley.events")
        assert not [e for e in events if e["type"] == "error"], "playback.cut was taken without complaint"
        await page.click("#hangup")
        await page.wait_for_function("window.parley.state === 'ended'")
