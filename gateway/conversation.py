"""The conversation loop: one call's turn-taking between the caller and Parley.

    listening ─SpeechStart─► user_speaking ─EndOfTurn─► responding ─first audio─► speaking
        ▲                                                                          │
        └──────────────── reply played out, or the caller barged in ◄──────────────┘

Driven by the engine's recognizer events (SpeechStart, Partial, Final, EndOfTurn). A reply
streams end to end: responder text deltas go to the TTS stream as they arrive, and TTS
audio goes to the pacer as it is made, so Parley starts speaking on the reply's first
phrase, not its last.

Pipelining: once the caller's partial transcript has been stable for `speculate_after_s`,
the responder starts on it, its text held back. If the turn then ends with those same
words, the held text is spoken at once (the responder's latency is hidden behind the
end-of-turn decision); if the caller says more, the attempt is cancelled unheard.

Barge-in, in two steps. (1) The caller makes a sound over the reply (the recognizer's
SpeechLikely, SpeechStart or any partial text) and the echo suppressor hears the caller's own
voice over Parley's (asked on every inbound frame for ONSET_AUDIBLE_S after the onset: a soft
onset comes through the suppressor later): the reply is paused (the pacer holds; the next
20 ms frame is silence) and `response.paused` is sent. (2) If the
recognizer hears a word (letters with a vowel: "no", "wait" — not the "s" or "o" it can
make of a cough, a breath or residual echo), the queued audio is dropped, the TTS stream
and the responder are cancelled, `response.interrupted {heard_text, played_ms}` is sent
and the history keeps only the words the caller heard (from the TTS word marks and the
pacer's played-sample count, which stopped at the pause). A cough or an "mm-hm" yields no
word: once FALSE_INTERRUPTION_S have passed and the sound has ended (its Final or end of
turn), or after MAX_PAUSE_S in any case, the reply plays on from where it paused
(`response.continued {paused_ms, rewound_ms}`).

A paused reply's last frames are still on their way when the pause begins (the network,
the client's jitter buffer: ~100 ms). A client that silences them at once on
`response.paused` says so (`playback.cut {turn}`; the demo page does); the reply then counts
as heard only up to the audio sent one playout delay (the page's latest `browser_playout_ms`)
before the pause, and a reply that plays on is rewound by as much, so the caller hears no gap.

Echo: callers without echo cancellation hear Parley in their microphone; the caller's audio
goes through an EchoSuppressor (gateway/echo_suppressor.py) fed with what the pacer sends,
so Parley does not take its own voice for a barge-in.

Session state: the history (with heard text) and the reply in progress (`PendingTurn`:
its text and the words played so far) are kept in the session record through `on_change`,
so a caller who reconnects (to this node or another) finds the conversation where it was,
and the unfinished reply either continues from the first unheard word (`continue`) or is
recorded as cut short (`drop`).

Silence and monologues: a caller who says nothing for `idle_prompt_s` is asked whether
they are still there, and after `idle_hangup_s` more the call ends (reason `idle`); a turn
longer than `max_turn_s` is ended by the loop (the recognizer is flushed), so a caller who
never pauses still gets an answer.

Responder actions (Handoff, EndCall) are performed once the text before them has played:
`session.handoff {reason}`, or the call ends with reason `assistant_ended`.

Failures reach the caller (an `error` event, and an apology where the voice still works) and
the operator (a log line, and `parley_call_errors_total{code}` from the event), and never
leave the call deaf or wedged. A failed recognizer stream is replaced (`stt_failed`: the turn
in progress is lost, so the caller is asked to say it again); one that cannot be, or keeps
failing, ends the call with a spoken goodbye (reason `stt_failed`). A reply whose voice fails
(its TTS stream breaks, or none can be opened: `tts_failed`) ends there, like a barge-in: the
history keeps the words heard, and the caller has the floor again.

Logs carry transcript text only with `privacy_log_content`; otherwise a turn's log line
has its word count alone.

Every transition is an event on the data channel (docs/events.md); `metrics.turn` breaks
each reply's latency down by stage, up to the first frame sent. The browser's playout start
is the last stage: the page reports it (`playout.started {turn}`), and a second
`metrics.turn` carries `browser_playout_ms`, measured on the server's clock from the first
frame sent to the report's arrival (so it includes the report's own trip back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import numpy as np

from engine.interface import Audio, EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, WordMark

from .echo_suppressor import EchoSuppressor
from .key_turns import KeyTurns
from .events import BadClientMessage, EventChannel
from .pacer import SAMPLE_RATE as PACER_RATE
from .pacer import PacedAudioTrack
from .recording import CallRecording
from .responders import Responder, ResponderError
from .dialog import PendingTurn, Turn

log = logging.getLogger("parley.conversation")

STT_RATE = 16000
WORD = re.compile(r"[a-z']*[aeiouy][a-z']*")  # a recognized token that can be a word (has a vowel)
DRAIN_POLL_S = 0.02  # how often a finishing reply checks that the pacer has played it all
PROGRESS_EVERY_S = 0.25  # how often the played position of a reply is saved to the session
RESUME_MODES = ("continue", "drop")  # what a resumed session does with a reply cut off by the drop
WATCH_EVERY_S = 0.1  # how often the idle and turn-length limits (and speculation) are checked
SPECULATE_AFTER_S = 0.3  # a partial unchanged this long starts the responder early
FALSE_INTERRUPTION_S = 0.6  # a reply paused for the caller's sound plays on if no word follows this soon
ONSET_AUDIBLE_S = 0.2  # after a SpeechLikely or SpeechStart, each inbound frame asks whether the caller is audible yet
MAX_PAUSE_S = 2.0  # ... and once the sound has ended; a wordless sound longer than this is not a turn
PLAYOUT_REPORTS_KEPT = 8  # replies whose first frame awaits the page's playout.started; older ones are forgotten
MAX_PLAYOUT_DELAY_S = 0.4  # a longer playout report is a stalled page, not its audio path
IDLE_PROMPT = "Are you still there?"
IDLE_GOODBYE = "I haven't heard from you, so I'll end the call now. Goodbye."
APOLOGY = "Sorry, I'm having trouble answering right now."
STT_APOLOGY = "Sorry, I missed that. Could you say it again?"
TRANSFER_FAILED = "Sorry, I couldn't connect you just now. I'm still here: how else can I help?"
STT_GOODBYE = "Sorry, I can't hear you anymore, so I'll end the call now. Please call again."
# A recognizer stream fails alone (its own audio or decoding), so a new one normally works; one
# that fails again and again is the engine failing, and the call ends rather than retry forever.
STT_REOPENS = 3


@dataclass
class StageTimes:
    """Monotonic times of one reply's stages (None until reached)."""

    speech_end: Optional[float] = None  # the caller's last word ended (estimated from word times)
    end_of_turn: Optional[float] = None  # the engine decided the turn was over
    first_token: Optional[float] = None  # the responder's first text
    first_audio: Optional[float] = None  # TTS's first audio chunk
    first_frame: Optional[float] = None  # the pacer sent its first frame

    def breakdown_ms(self) -> dict[str, Optional[float]]:
        def span(a: Optional[float], b: Optional[float]) -> Optional[float]:
            return round((b - a) * 1000, 1) if a is not None and b is not None else None

        return {"end_of_turn_ms": span(self.speech_end, self.end_of_turn),
                "responder_first_token_ms": span(self.end_of_turn, self.first_token),
                "tts_first_audio_ms": span(self.first_token, self.first_audio),
                "first_frame_ms": span(self.first_audio, self.first_frame),
                "total_ms": span(self.speech_end or self.end_of_turn, self.first_frame)}


class Speculation:
    """A responder run started on a stable partial transcript; its deltas are held back."""

    def __init__(self, text: str, deltas: AsyncIterator[Any]) -> None:
        self.text = text
        self.items: list[Any] = []
        self.done = False
        self.error: Optional[BaseException] = None
        self._changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._collect(deltas))

    async def _collect(self, deltas: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(deltas):
                async for item in deltas:
                    self.items.append(item)
                    self._changed.set()
        except Exception as exc:  # replayed to the reply, which apologises
            self.error = exc
        finally:
            self.done = True
            self._changed.set()

    async def replay(self) -> AsyncIterator[Any]:
        """What was held back, then the rest as it comes."""
        sent = 0
        while True:
            while sent < len(self.items):
                sent += 1
                yield self.items[sent - 1]
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            self._changed.clear()
            await self._changed.wait()

    def cancel(self) -> None:
        self.task.cancel()


def has_word(text: str) -> bool:
    return any(len(token) >= 2 and WORD.fullmatch(token) for token in text.lower().split())


def same_words(a: str, b: str) -> bool:
    return a.lower().split() == b.lower().split()


@dataclass
class Reply:
    """One assistant reply: its text so far, where its audio sits in the pacer, its word marks."""

    turn: int
    text: str = ""
    responder_done: bool = False
    tts_done: bool = False  # the current TTS stream has given all its audio
    start_sample: Optional[int] = None  # pacer sample (48 kHz) where the current TTS stream's audio starts
    written: int = 0  # 48 kHz samples of the current TTS stream written to the pacer
    rate: Optional[int] = None  # the TTS stream's sample rate
    marks: list[tuple[str, int]] = field(default_factory=list)  # (word, sample offset in the TTS stream)
    skipped_words: int = 0  # words heard before a resume (not synthesized again)
    actions: list[Any] = field(default_factory=list)  # Handoff / EndCall, performed after playback
    times: StageTimes = field(default_factory=StageTimes)

    def heard(self, pacer: PacedAudioTrack, unheard_samples: int = 0) -> tuple[str, int]:
        """(the words the caller heard, played ms): a word counts once its audio started;
        `unheard_samples` of the last audio sent never reached the caller's ear (cut by the client)."""
        played = self.played(pacer) - unheard_samples
        if played <= 0:
            played = 0
        played_tts = played * (self.rate or PACER_RATE) / PACER_RATE
        words = self.text.split()[:self.skipped_words]
        words += [word for word, offset in self.marks if offset < played_tts]
        return " ".join(words), round(played * 1000 / PACER_RATE)

    def played(self, pacer: PacedAudioTrack) -> int:
        """Samples of the current TTS stream's audio sent so far (48 kHz)."""
        if self.start_sample is None or self.rate is None:
            return 0
        return max(0, min(self.written, pacer.played_samples - self.start_sample))


class Conversation:
    """A call mode (gateway/call.py `Mode`): the caller talks with a responder through the engine."""

    def __init__(self, stt: Any, open_tts: Callable[[], Any], responder: Responder, pacer: PacedAudioTrack,
                 events: EventChannel, history: Optional[list[Turn]] = None,
                 hang_up: Optional[Callable[[str], Awaitable[None]]] = None,
                 pending: Optional[PendingTurn] = None,
                 resume_unfinished: str = "continue", on_change: Optional[Callable[[], None]] = None,
                 idle_prompt_s: float = 15.0, idle_hangup_s: float = 15.0, max_turn_s: float = 30.0,
                 speculate_after_s: Optional[float] = SPECULATE_AFTER_S,
                 recording: Optional[CallRecording] = None, reopen_stt: Optional[Callable[[], Any]] = None,
                 log_content: bool = False, logger: Optional[logging.Logger | logging.LoggerAdapter] = None) -> None:
        self.stt = stt
        self.reopen_stt = reopen_stt  # a new recognizer stream for this call (None: a failed one ends the call)
        self._stt_failures = 0
        self.log_content = log_content  # privacy_log_content: transcript text may go to the logs
        self.log = logger or log
        self.recording = recording
        self.open_tts = open_tts
        self.responder = responder
        self.hang_up = hang_up
        self.pacer = pacer
        self.events = events
        self.history: list[Turn] = history if history is not None else []
        self.in_progress = pending  # the reply being spoken, as the session records it
        self.resume_unfinished = resume_unfinished
        self.on_change = on_change or (lambda: None)
        self.state = "listening"
        self.reply: Optional[Reply] = None
        self.turns = 0
        self._pushed_samples = 0  # caller audio given to the recognizer (16 kHz)
        self._user_text: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        self._reply_task: Optional[asyncio.Task] = None
        self._tts: Any = None
        self._speech_end: Optional[float] = None
        self.echo = EchoSuppressor()
        pacer.on_sent = self._on_sent
        self.idle_prompt_s, self.idle_hangup_s, self.max_turn_s = idle_prompt_s, idle_hangup_s, max_turn_s
        self._last_activity = time.monotonic()
        self._idle_prompted = False
        self._turn_started: Optional[float] = None
        self._forcing_turn_end = False
        self.speculate_after_s = speculate_after_s
        self._partial: tuple[str, float] = ("", 0.0)  # the latest partial text and when it changed
        self._speculation: Optional[Speculation] = None
        self._awaiting_playout: dict[int, float] = {}  # turn -> when its first frame was sent (monotonic)
        self._paused_at: Optional[float] = None  # the reply was paused for the caller's sound (monotonic)
        self._cut_by_client = False  # ... and the client silenced the audio then on its way (playback.cut)
        self._playout_delay_s: Optional[float] = None  # the page's latest browser_playout_ms, in s
        self._caller_quiet = asyncio.Event()  # cleared from SpeechStart until the Final or end of turn
        self._caller_quiet.set()
        self._onset_at: Optional[float] = None  # the last SpeechLikely or SpeechStart (s of caller audio pushed)
        self.keys = KeyTurns(self._on_key_turn)
        # A call that can transfer the caller (SIP: REFER) sets this; True when the caller was handed over.
        self.transfer: Optional[Callable[[Any], Awaitable[bool]]] = None
        events.handle("playout.started", self.on_playout_started)
        events.handle("playback.cut", self.on_playback_cut)

    # -- Mode --------------------------------------------------------------------------------

    def on_audio(self, pcm: np.ndarray) -> None:
        self._pushed_samples += len(pcm)
        self.stt.push(self.echo.process(pcm))
        if self.recording is not None:
            self.recording.write(pcm, self.echo.last_reference)
        if self._onset_at is not None and self._pushed_samples / STT_RATE - self._onset_at < ONSET_AUDIBLE_S:
            self._maybe_pause()  # the recognizer heard a sound start; the caller's voice may only now come through

    def _on_sent(self, pcm48k: np.ndarray) -> None:
        """The pacer sent a frame: it is the echo reference (decimated to 16 kHz; the TTS
        audio has little energy above 8 kHz, so averaging three samples is filter enough),
        and it may be the reply's first."""
        self.echo.add_reference(pcm48k.reshape(-1, PACER_RATE // STT_RATE).mean(axis=1).astype(np.int16))
        if self.reply is not None and self.reply.times.first_frame is None:
            self._check_first_frame(self.reply)

    def describe(self) -> dict:
        return {"mode": "conversation"}

    async def run(self) -> None:
        if self.in_progress is not None:
            self._continue_unfinished(self.in_progress)
        elif not self.history:  # a new session: the responder may speak first (a greeting)
            self._start_reply(StageTimes(), greeting=True)
        self._spawn(self._watch_limits())
        while await self._listen():
            pass

    async def _listen(self) -> bool:
        """Drive the loop from the recognizer's events; True when a failed stream was replaced
        (listen again), False when the stream ended (the call is closing) or the call must end."""
        try:
            async for event in self.stt.events():
                self.on_stt_event(event)
        except Exception as exc:  # StreamFailed: the engine closed this stream on an error of its own
            return self._on_stt_failed(exc)
        return False

    def close(self) -> None:
        self.keys.close()
        self._cancel_reply()
        if self._speculation is not None:
            self._speculation.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.stt.close()
        if self.recording is not None:
            self.recording.close()
        self._spawn_detached(self.responder.aclose())

    # -- a failed recognizer -----------------------------------------------------------------

    def _on_stt_failed(self, exc: Exception) -> bool:
        """The recognizer stream failed: without a new one the caller would never be heard again.
        A caller expects to go on talking, so reopen it (True) and ask them to repeat what was
        lost; if that is impossible or it keeps failing, say so and end the call (False)."""
        self._stt_failures += 1
        stt = self._reopen_stt() if self._stt_failures <= STT_REOPENS else None
        self.log.warning("speech recognition failed", extra={"error": type(exc).__name__, "reopened": stt is not None,
                                                             "failures": self._stt_failures})
        self.events.error("stt_failed", "speech recognition failed: " + (
            "listening again; the words being spoken were lost" if stt is not None else "the call ends"))
        self._forget_caller_turn()
        if stt is None:
            if self.reply is not None:
                self._cut_reply(self.reply)
            self.say(STT_GOODBYE, hang_up="stt_failed")
            return False
        self.stt = stt
        if self.reply is None:  # (during a reply the caller was listening: nothing of theirs was lost)
            self.say(STT_APOLOGY)
        return True

    def _reopen_stt(self) -> Any:
        if self.reopen_stt is None:
            return None
        try:
            return self.reopen_stt()
        except Exception as exc:  # CapacityError, or the engine closing
            self.log.warning("speech recognition could not be reopened", extra={"error": type(exc).__name__})
            return None

    def _forget_caller_turn(self) -> None:
        """The caller's turn in progress went with the failed stream: no Final or end of turn
        will come for it, so nothing may wait for them."""
        self._user_text = []
        self._partial = ("", 0.0)
        if self._speculation is not None:
            self._speculation.cancel()
            self._speculation = None
        self._turn_started = None
        self._forcing_turn_end = False
        self._speech_end = None
        self._onset_at = None
        self._caller_quiet.set()
        if self.state == "user_speaking":
            self._set_state("listening")

    # -- the caller's side --------------------------------------------------------------------

    def on_stt_event(self, event: Any) -> None:
        """One recognizer event (SpeechLikely, SpeechStart, Partial, Final, EndOfTurn) drives the state machine."""
        self._heard_caller(event)
        if isinstance(event, SpeechLikely):
            self._maybe_pause()  # cheap to undo: a sound that brings no word plays the reply on
        elif isinstance(event, SpeechStart):
            self._on_speech_start()
        elif isinstance(event, Partial):
            self.events.emit("transcript.partial", text=event.text)
            if self._speaking() and self._caller_spoke(event.text):
                self._barge_in()
            elif event.text.strip():
                self._maybe_pause()
            self._on_partial(event.text)
        elif isinstance(event, Final):
            self._on_final(event)
        elif isinstance(event, EndOfTurn):
            self._on_end_of_turn(event)

    def _heard_caller(self, event: Any) -> None:
        """What the caller is doing: activity (for the idle limits) and a sound under way (barge-in)."""
        if isinstance(event, SpeechStart) or (isinstance(event, (Partial, Final)) and event.text.strip()):
            self._last_activity = time.monotonic()
            self._idle_prompted = False
        if isinstance(event, (SpeechLikely, SpeechStart)):
            self._onset_at = self._pushed_samples / STT_RATE
        if isinstance(event, SpeechStart):
            self._caller_quiet.clear()
        elif isinstance(event, (Final, EndOfTurn)):
            self._caller_quiet.set()

    def _speaking(self) -> bool:
        return self.state in ("responding", "speaking") and self.reply is not None

    def _caller_spoke(self, text: str) -> bool:
        """A word, and the caller's own voice audible over Parley's (not its echo's residue)."""
        return has_word(text) and self.echo.caller_audible()

    def _on_speech_start(self) -> None:
        if self.state == "listening":
            self._set_state("user_speaking")
            self._turn_started = time.monotonic()
        else:
            self._maybe_pause()

    def _on_final(self, event: Final) -> None:
        words = [{"word": w, "start": round(t0, 3), "end": round(t1, 3)} for w, t0, t1 in event.words]
        self.events.emit("transcript.final", text=event.text, words=words)
        if not event.text.strip():
            return
        if self._speaking():
            if not self._caller_spoke(event.text):
                return  # a cough or residual echo during the reply: not the caller's turn
            self._barge_in()
        self._user_text.append(event.text)
        if event.words:  # when, on the wall clock, the last word ended
            lag_s = self._pushed_samples / STT_RATE - event.words[-1][2]
            self._speech_end = time.monotonic() - max(0.0, lag_s)
        if self._forcing_turn_end:
            self._on_end_of_turn(EndOfTurn(confidence=0.0), forced=True)

    def _on_end_of_turn(self, event: EndOfTurn, forced: bool = False) -> None:
        self._forcing_turn_end = False
        self._turn_started = None
        self.events.emit("turn.end", confidence=round(event.confidence, 3), **({"forced": True} if forced else {}))
        speculation, self._speculation = self._speculation, None
        self._partial = ("", 0.0)
        if not self._user_text:  # a turn with no words (a cough, noise) starts nothing
            if speculation is not None:
                speculation.cancel()
            if self.state == "user_speaking":
                self._set_state("listening")
            return
        text = " ".join(self._user_text)
        self._user_text = []
        self._record(Turn("user", text))
        self.on_change()
        times = StageTimes(speech_end=self._speech_end, end_of_turn=time.monotonic())
        self._speech_end = None
        if speculation is not None and same_words(speculation.text, text):
            self._start_reply(times, deltas=speculation.replay())
        else:
            if speculation is not None:
                speculation.cancel()  # the caller said more than the attempt was made on
            self._start_reply(times)

    def on_dtmf(self, digit: str, source: str) -> None:
        """A key the caller pressed (a SIP call's DTMF): the `dtmf` event now; a key over a
        reply interrupts it; the keys become a caller turn (gateway/key_turns.py)."""
        self.events.emit("dtmf", digit=digit, source=source)
        self._last_activity = time.monotonic()
        self._idle_prompted = False
        if self._speaking():
            self._barge_in()
            self._set_state("listening")  # (a key is not speech: no spoken turn is under way)
            self._turn_started = None
        self.keys.press(digit)

    def _on_key_turn(self, keys: str) -> None:
        self.events.emit("turn.end", confidence=1.0, keys=keys)
        self._record(Turn("user", keys))
        self.on_change()
        self._start_reply(StageTimes(end_of_turn=time.monotonic()))

    # -- pipelining -----------------------------------------------------------------------------

    def _on_partial(self, text: str) -> None:
        if not text.strip() or text == self._partial[0]:
            return
        self._partial = (text, time.monotonic())
        if self._speculation is not None and not same_words(self._speculation.text, text):
            self._speculation.cancel()
            self._speculation = None

    def _maybe_speculate(self, now: float) -> None:
        text, since = self._partial
        if (self.speculate_after_s is None or self._speculation is not None or not text.strip()
                or self.state != "user_speaking" or now - since < self.speculate_after_s):
            return
        heard = " ".join([*self._user_text, text])
        self._speculation = Speculation(heard, self.responder.respond([*self.history, Turn("user", heard)]))

    # -- limits: silence and monologues ------------------------------------------------------

    async def _watch_limits(self) -> None:
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            now = time.monotonic()
            if (self.state == "user_speaking" and self._turn_started is not None and not self._forcing_turn_end
                    and now - self._turn_started > self.max_turn_s):
                self._force_turn_end()
            self._maybe_speculate(now)
            if self.state == "listening" and self.reply is None:
                limit = self.idle_hangup_s if self._idle_prompted else self.idle_prompt_s
                if now - self._last_activity > limit:
                    self._on_idle()

    def _force_turn_end(self) -> None:
        """The caller has talked for max_turn_s without a pause: answer what was heard."""
        self._forcing_turn_end = True
        flush = getattr(self.stt, "flush", None)
        if flush is not None:
            flush()  # its Final ends the turn (_on_final)
        else:
            self._on_end_of_turn(EndOfTurn(confidence=0.0), forced=True)

    def _on_idle(self) -> None:
        if not self._idle_prompted:
            self._idle_prompted = True
            self.say(IDLE_PROMPT)
        else:
            self.say(IDLE_GOODBYE, hang_up="idle")

    def say(self, text: str, hang_up: Optional[str] = None) -> None:
        """Speak `text` now, on Parley's own initiative (not the responder's): an idle prompt,
        a notice; it is a reply like any other (barge-in, history, metrics)."""
        async def deltas() -> AsyncIterator[Any]:
            yield text

        self._start_reply(StageTimes(), deltas=deltas())
        if hang_up:  # (an action of the reply from the start: it is performed even if the voice fails)
            self.reply.actions.append(_HangUp(hang_up))

    # -- Parley's side --------------------------------------------------------------------------

    def _continue_unfinished(self, pending: PendingTurn) -> None:
        """A resumed session whose last reply was cut off by the drop."""
        heard_words = len(pending.heard_text.split())
        if self.resume_unfinished == "drop" or heard_words >= len(pending.text.split()):
            self._record(Turn("assistant", pending.text, heard_text=pending.heard_text))
            self._set_progress(None)
            return
        self.turns += 1
        reply = self.reply = Reply(self.turns, text=pending.text, responder_done=True, skipped_words=heard_words)
        self._set_state("responding")
        self.events.emit("response.resumed", turn=reply.turn, from_word=heard_words)
        if not self._open_voice(reply):
            return
        self._tts.push_text(" ".join(pending.text.split()[heard_words:]))
        self._tts.end()
        self._reply_task = self._spawn(self._finish(reply))

    def _set_progress(self, reply: Optional[Reply]) -> None:
        """Record the reply in progress (or none) in the session."""
        if reply is None:
            self.in_progress = None
        else:
            heard, played_ms = reply.heard(self.pacer)
            self.in_progress = PendingTurn(reply.text, played_ms, heard)
        self.on_change()

    def _start_reply(self, times: StageTimes, greeting: bool = False, deltas: Optional[AsyncIterator[Any]] = None) -> None:
        self._cancel_reply()
        self.turns += 1
        self.reply = Reply(self.turns, times=times)
        self._set_state("responding")
        if deltas is None:
            deltas = self.responder.start() if greeting else self.responder.respond(list(self.history))
        self._reply_task = self._spawn(self._produce(self.reply, deltas))

    async def _produce(self, reply: Reply, deltas: AsyncIterator[Any]) -> None:
        """Responder deltas -> events and TTS; then wait for the audio to play out."""
        async with contextlib.aclosing(deltas):
            if not self._open_voice(reply):
                return
            await self._take_all(reply, deltas)
        reply.responder_done = True
        if self._tts is not None:
            self._tts.end()
        await self._finish(reply)

    async def _take_all(self, reply: Reply, deltas: AsyncIterator[Any]) -> None:
        """Every responder delta into the reply; a responder that fails is apologised for."""
        try:
            async for item in deltas:
                self._take(reply, item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failing responder must never leave the caller in silence
            code = exc.code if isinstance(exc, ResponderError) else "responder_failed"
            self.log.warning("responder failed", extra={"error": code})
            self.events.error(code, "the assistant could not answer, and apologised")
            self._take(reply, (" " if reply.text else "") + APOLOGY)

    def _take(self, reply: Reply, item: Any) -> None:
        """One responder delta: text is shown and spoken at once; actions wait for playback."""
        if not isinstance(item, str):
            reply.actions.append(item)
            return
        if reply.times.first_token is None:
            reply.times.first_token = time.monotonic()
        reply.text += item
        self.events.emit("response.text.delta", turn=reply.turn, delta=item)
        if self._tts is not None:
            self._tts.push_text(item)
        self._set_progress(reply)

    def _open_voice(self, reply: Reply) -> bool:
        """Open the reply's TTS stream; False (the reply is over) when none can be had."""
        try:
            self._tts = self._new_tts(reply)
        except Exception as exc:  # CapacityError: every TTS slot is taken, or the engine is closing
            self._on_tts_failed(reply, exc)
            return False
        return True

    def _new_tts(self, reply: Reply) -> Any:
        tts = self.open_tts()
        self._spawn(self._play(reply, tts))
        return tts

    async def _play(self, reply: Reply, tts: Any) -> None:
        """TTS events -> the pacer (audio) and the reply's word marks."""
        try:
            async for event in tts.events():
                if tts is not self._tts:
                    return  # cancelled (barge-in): this stream's remaining audio must not play
                if isinstance(event, WordMark):
                    reply.marks.append((event.word, event.sample_offset))
                elif isinstance(event, Audio):
                    self._write_audio(reply, event)
        except Exception as exc:  # StreamFailed: no more audio will come for this reply
            if tts is self._tts:
                self._on_tts_failed(reply, exc)
            return
        if tts is self._tts:
            reply.tts_done = True

    def _on_tts_failed(self, reply: Reply, exc: Exception) -> None:
        """The reply lost its voice: it ends here, as if interrupted (its queued audio dropped, the
        history keeping the words heard), and the caller has the floor: the state is listening
        again, so the idle watchdog runs. No spoken apology: there is no voice to give it in."""
        if self.reply is not reply:
            return  # already over (a barge-in, a newer reply)
        self.log.warning("speech synthesis failed: the reply ends", extra={"error": type(exc).__name__,
                                                                           "turn": reply.turn})
        self.events.emit("error", code="tts_failed", message="speech synthesis failed: the reply ended early",
                         turn=reply.turn)
        self._cut_reply(reply)
        self._set_state("listening")
        self._last_activity = time.monotonic()
        for action in reply.actions:  # what the reply was to do after its text still happens (a hang-up)
            self._spawn(self._perform(action))

    def _write_audio(self, reply: Reply, audio: Audio) -> None:
        if reply.start_sample is None:
            reply.start_sample = self.pacer.write_position
            reply.rate = audio.sample_rate
            if reply.times.first_audio is None:
                reply.times.first_audio = time.monotonic()
            self.events.emit("response.audio.start", turn=reply.turn)
            self._set_state("speaking")
        self.pacer.write(audio.pcm, audio.sample_rate)
        reply.written = self.pacer.write_position - reply.start_sample

    def _check_first_frame(self, reply: Reply) -> None:
        """Called as each frame is sent: the one carrying the reply's first audio completes the
        server's stages (metrics.turn), timed exactly, before any browser can have heard it."""
        if reply.start_sample is None or self.pacer.played_samples <= reply.start_sample:
            return
        reply.times.first_frame = time.monotonic()
        self.events.emit("metrics.turn", turn=reply.turn, **reply.times.breakdown_ms())
        self._awaiting_playout[reply.turn] = reply.times.first_frame
        for turn in list(self._awaiting_playout)[:-PLAYOUT_REPORTS_KEPT]:
            del self._awaiting_playout[turn]

    def on_playout_started(self, message: dict) -> None:
        """The page heard a reply start playing (`playout.started {turn}`): the browser stage,
        first frame sent -> the report's arrival, on this clock (the browser's is another)."""
        turn = message.get("turn")
        if type(turn) is not int or turn < 1:  # (bool is an int subclass; true is no turn)
            raise BadClientMessage("playout.started needs 'turn': the positive integer of a response.audio.start")
        first_frame = self._awaiting_playout.pop(turn, None)
        if first_frame is None:
            raise BadClientMessage("playout.started names a turn with no reply awaiting a playout report "
                                   "(unknown, not sent yet, or already reported)")
        playout_ms = round((time.monotonic() - first_frame) * 1000, 1)
        self.events.emit("metrics.turn", turn=turn, browser_playout_ms=playout_ms)
        if playout_ms <= MAX_PLAYOUT_DELAY_S * 1000:
            self._playout_delay_s = playout_ms / 1000

    def on_playback_cut(self, message: dict) -> None:
        """The page silenced a paused reply's audio still on its way (`playback.cut {turn}`)."""
        turn = message.get("turn")
        if type(turn) is not int or turn < 1:
            raise BadClientMessage("playback.cut needs 'turn': the positive integer of a response.paused")
        if self.reply is not None and self.reply.turn == turn and self._paused_at is not None:
            self._cut_by_client = True  # (a cut that crossed the reply's end or interruption is moot)

    def _unheard_samples(self) -> int:
        """Of the audio sent before the pause, how much the client's cut kept from the caller."""
        if not self._cut_by_client or self._playout_delay_s is None:
            return 0
        return round(self._playout_delay_s * PACER_RATE)

    async def _finish(self, reply: Reply) -> None:
        """Wait until the reply's audio has played out, then record it as heard in full."""
        saved = time.monotonic()
        while not reply.tts_done or (reply.start_sample is not None
                                     and self.pacer.played_samples < reply.start_sample + reply.written):
            await asyncio.sleep(DRAIN_POLL_S)
            if time.monotonic() - saved >= PROGRESS_EVERY_S:
                saved = time.monotonic()
                self._set_progress(reply)
        if reply.times.first_audio is not None:  # (an empty greeting plays nothing)
            self.events.emit("response.audio.end", turn=reply.turn)
        if reply.text:
            self._record(Turn("assistant", reply.text, heard_text=reply.text))
        self.reply = None
        self._set_progress(None)
        self._set_state("listening")
        self._last_activity = time.monotonic()  # the caller's silence counts from the end of the reply
        for action in reply.actions:
            await self._perform(action)

    async def _perform(self, action: Any) -> None:
        if action.kind == "handoff":
            target = getattr(action, "target", "")
            self.events.emit("session.handoff", reason=action.reason, **({"target": target} if target else {}))
            if self.transfer is not None and not await self.transfer(action):
                self.say(TRANSFER_FAILED)  # the caller stays on the line with Parley
        elif action.kind == "end_call" and self.hang_up is not None:
            reason = action.reason if isinstance(action, _HangUp) else "assistant_ended"
            self._spawn_detached(self.hang_up(reason))

    # -- barge-in ------------------------------------------------------------------------------

    def _maybe_pause(self) -> None:
        """The caller may be starting to talk over the reply: silence it from the next frame,
        and play on if no word follows within FALSE_INTERRUPTION_S."""
        if self.state != "speaking" or self._paused_at is not None or not self.echo.caller_audible():
            return  # (a soft onset is often not yet audible over the echo: on_audio asks again each frame)
        self._paused_at = time.monotonic()
        self.pacer.hold()
        self.events.emit("response.paused", turn=self.reply.turn)
        self._spawn(self._play_on_unless_words(self.reply))

    async def _play_on_unless_words(self, reply: Reply) -> None:
        await asyncio.sleep(FALSE_INTERRUPTION_S)
        # A caller still making sound may yet say a word (the pause comes on the onset, before
        # the recognizer has a character): play on once the sound has ended.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._caller_quiet.wait(), MAX_PAUSE_S - FALSE_INTERRUPTION_S)
        if self.reply is reply and self._paused_at is not None:
            paused_ms = round((time.monotonic() - self._paused_at) * 1000)
            rewound = self._end_pause(rewind_samples=min(self._unheard_samples(), reply.played(self.pacer)))
            self.events.emit("response.continued", turn=reply.turn, paused_ms=paused_ms,
                             rewound_ms=round(rewound * 1000 / PACER_RATE))

    def _end_pause(self, rewind_samples: int = 0) -> int:
        self._paused_at = None
        self._cut_by_client = False
        return self.pacer.release(rewind_samples)

    def _barge_in(self) -> None:
        """The caller spoke a word over the reply: silence now, keep only what was heard."""
        reply = self.reply
        heard, played_ms = self._cut_reply(reply)
        self.events.emit("response.interrupted", turn=reply.turn, heard_text=heard, played_ms=played_ms)
        self._set_state("user_speaking")
        self._turn_started = time.monotonic()

    def _cut_reply(self, reply: Reply) -> tuple[str, int]:
        """Stop the reply now; the history keeps the words the caller heard. (heard text, played ms)"""
        heard, played_ms = reply.heard(self.pacer, self._unheard_samples())
        self.pacer.flush()
        self._cancel_reply()
        if reply.text:
            self._record(Turn("assistant", reply.text, heard_text=heard))
        self.reply = None
        self._set_progress(None)
        return heard, played_ms

    def _stop_tts(self) -> None:
        tts, self._tts = self._tts, None
        if tts is not None:
            tts.cancel()

    def _cancel_reply(self) -> None:
        self._end_pause()
        self._stop_tts()
        task, self._reply_task = self._reply_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # (a reply ending itself, e.g. with no voice to be had, just returns)

    # -- helpers --------------------------------------------------------------------------------

    def _set_state(self, state: str) -> None:
        self.state = state

    def _record(self, turn: Turn) -> None:
        """A finished turn: into the history, and into the log (its text only when
        privacy_log_content allows; the word counts always)."""
        self.history.append(turn)
        fields: dict[str, Any] = {"role": turn.role, "words": len(turn.text.split())}
        if turn.heard_text is not None:
            fields["heard_words"] = len(turn.heard_text.split())
        if self.log_content:
            fields["text"] = turn.text
            if turn.heard_text is not None and turn.heard_text != turn.text:
                fields["heard_text"] = turn.heard_text
        self.log.info("turn", extra=fields)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _spawn_detached(self, coro) -> None:
        """Work that must outlive close() (closing the call, releasing the responder)."""
        task = asyncio.get_running_loop().create_task(coro)
        _DETACHED.add(task)
        task.add_done_callback(_DETACHED.discard)


_DETACHED: set[asyncio.Task] = set()  # strong references, so detached tasks are not collected


@dataclass(frozen=True)
class _HangUp:
    """Parley's own end of the call (e.g. `idle`), performed after its text has played."""

    reason: str
    kind = "end_call"

