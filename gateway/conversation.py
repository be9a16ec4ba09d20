"""The conversation loop: one call's turn-taking between the caller and Parley.

Over 400 lines, kept as one module: it is the turn state machine alone, and each handler here
reads and moves the same call's state (turn, reply, idle clock, recognizer stream); the reply
pipeline, barge-in and speculation are their own modules already.

    listening ─SpeechStart─► user_speaking ─EndOfTurn─► responding ─first audio─► speaking
        ▲                                                                          │
        └──────────────── reply played out, or the caller barged in ◄──────────────┘

Driven by the engine's recognizer events (SpeechStart, Partial, Final, EndOfTurn). This module
is the turn state machine; the other two rooms of a conversation are gateway/reply.py (Parley's
reply: responder -> TTS -> pacer, with stage times) and gateway/barge_in.py (the caller talking
over it: pause, continue, interrupt).

Pipelining: once the caller's partial transcript has been stable for `speculate_after_s`,
the responder starts on it, its text held back (gateway/speculation.py). If the turn then
ends with those same words, the held text is spoken at once (the responder's latency is
hidden behind the end-of-turn decision); if the caller says more, the attempt is cancelled
unheard.

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
history keeps the words heard, and the caller has the floor again. A stream fails alone (its
own text), so a new one normally speaks: the caller hears a short apology in it, once (an
apology that loses its voice too is not apologised for). A reply that stalls (`reply_stalled`,
gateway/reply.py) or whose own task raises (`internal_error`, logged with its traceback) ends
the same way.

Logs carry transcript text only with `privacy_log_content`; otherwise a turn's log line
has its word count alone.

Every transition is an event on the data channel (docs/events.md).

Why this module is over 400 lines: it is one state machine. Every handler below reads and
moves the same few fields (the state, the caller's words so far, the turn's start, the idle
clock), and each transition is easiest to check with all of them on one page. What has
state of its own lives elsewhere: the reply (reply.py), barge-in (barge_in.py), the early
responder run (speculation.py), keys (key_turns.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import numpy as np

from engine.interface import EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, SttEvent, SttStream, TtsStream

from .barge_in import BargeIn
from .dialog import PendingTurn, Turn
from .echo_suppressor import EchoSuppressor
from .events import EventChannel
from .key_turns import KeyTurns
from .pacer import PacedAudioTrack, SentFrame
from .recording import CallRecording
from .reply import REPLY_STALL_S, Reply, Speaker, StageTimes
from .responders import Responder
from .speculation import Speculation, same_words

log = logging.getLogger("parley.conversation")

STT_RATE = 16000
RESUME_MODES = ("continue", "drop")  # what a resumed session does with a reply cut off by the drop
WATCH_EVERY_S = 0.1  # how often the idle and turn-length limits (and speculation) are checked
SPECULATE_AFTER_S = 0.3  # a partial unchanged this long starts the responder early
IDLE_PROMPT = "Are you still there?"
IDLE_GOODBYE = "I haven't heard from you, so I'll end the call now. Goodbye."
STT_APOLOGY = "Sorry, I missed that. Could you say it again?"
TRANSFER_FAILED = "Sorry, I couldn't connect you just now. I'm still here: how else can I help?"
STT_GOODBYE = "Sorry, I can't hear you anymore, so I'll end the call now. Please call again."
TTS_APOLOGY = "Sorry, I was cut off. Could you ask me that again?"
# A recognizer stream fails alone (its own audio or decoding), so a new one normally works; one
# that fails again and again is the engine failing, and the call ends rather than retry forever.
STT_REOPENS = 3


class Conversation:
    """A call mode (gateway/call.py `Mode`): the caller talks with a responder through the engine.

    It is the ReplyHost of its Speaker (gateway/reply.py): told when a reply starts, becomes
    audible, plays out or loses its voice, it moves the turn state and keeps the history."""

    def __init__(self, stt: SttStream, open_tts: Callable[[], TtsStream], responder: Responder, pacer: PacedAudioTrack,
                 events: EventChannel, history: Optional[list[Turn]] = None,
                 hang_up: Optional[Callable[[str], Awaitable[None]]] = None,
                 pending: Optional[PendingTurn] = None,
                 resume_unfinished: str = "continue", on_change: Optional[Callable[[], None]] = None,
                 idle_prompt_s: float = 15.0, idle_hangup_s: float = 15.0, max_turn_s: float = 30.0,
                 speculate_after_s: Optional[float] = SPECULATE_AFTER_S,
                 recording: Optional[CallRecording] = None, reopen_stt: Optional[Callable[[], SttStream]] = None,
                 last_turn: int = 0, log_content: bool = False, logger: Optional[logging.Logger | logging.LoggerAdapter] = None,
                 reply_stall_s: float = REPLY_STALL_S) -> None:
        self.stt = stt
        self.reopen_stt = reopen_stt  # a new recognizer stream for this call (None: a failed one ends the call)
        self._stt_failures = 0
        self._tts_apology: Optional[Reply] = None  # the apology for a reply that lost its voice, while it lasts
        self.log_content = log_content  # privacy_log_content: transcript text may go to the logs
        self.log = logger or log
        self.recording = recording
        self.responder = responder
        self.hang_up = hang_up
        self.pacer = pacer
        self.events = events
        self.history: list[Turn] = history if history is not None else []
        self.in_progress = pending  # the reply being spoken, as the session records it
        self.resume_unfinished = resume_unfinished
        self.on_change = on_change or (lambda: None)
        self.state = "listening"
        self._pushed_samples = 0  # caller audio given to the recognizer (16 kHz)
        self._user_text: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        self._watcher: Optional[asyncio.Task] = None  # the idle and turn-length limits (_watch_limits)
        self._speech_end: Optional[float] = None
        self.echo = EchoSuppressor()
        self.speaker = Speaker(self, open_tts, pacer, events, turns=last_turn,  # (numbering goes on after a resume)
                               stall_s=reply_stall_s)
        self.barge_in = BargeIn(self.speaker, pacer, events, self.echo, speaking=lambda: self.state == "speaking",
                                spawn=self.spawn)
        pacer.on_sent = self._on_sent
        self.idle_prompt_s, self.idle_hangup_s, self.max_turn_s = idle_prompt_s, idle_hangup_s, max_turn_s
        self._last_activity = time.monotonic()
        self._idle_prompted = False
        self._turn_started: Optional[float] = None
        self._forcing_turn_end = False
        self.speculate_after_s = speculate_after_s
        self._partial: tuple[str, float] = ("", 0.0)  # the latest partial text and when it changed
        self._tentative = ""  # the latest partial's tentative words (engine.interface.Partial)
        self._speculation: Optional[Speculation] = None
        self.keys = KeyTurns(self._on_key_turn)
        # A call that can transfer the caller (SIP: REFER) sets this; True when the caller was handed over.
        self.transfer: Optional[Callable[[Any], Awaitable[bool]]] = None
        events.handle("playout.started", self.speaker.on_playout_started)
        events.handle("playback.cut", self.barge_in.on_playback_cut)

    @property
    def reply(self) -> Optional[Reply]:
        """The reply being spoken (None between replies)."""
        return self.speaker.reply

    # -- Mode --------------------------------------------------------------------------------

    def on_audio(self, pcm: np.ndarray) -> None:
        self._pushed_samples += len(pcm)
        self.stt.push(self.echo.process(pcm))
        if self.recording is not None:
            self.recording.write(pcm, self.echo.last_reference)
        self.barge_in.on_audio(self._pushed_samples / STT_RATE)

    def _on_sent(self, frame: SentFrame) -> None:
        """The pacer sent a frame, which may be the reply's first. Its echo reference (the
        same 20 ms, resampled by the pacer from the TTS audio straight to the recogniser's
        rate) goes to the suppressor now, as the frame leaves: the holds, flushes and rewinds
        reach the suppressor exactly as the caller's loudspeaker plays them."""
        self.echo.add_reference(frame.reference)
        self.speaker.on_frame_sent()

    def describe(self) -> dict:
        return {"mode": "conversation"}

    async def run(self) -> None:
        if self.in_progress is not None:
            self._continue_unfinished(self.in_progress)
        elif not self.history:  # a new session: the responder may speak first (a greeting)
            self._start_reply(StageTimes(), greeting=True)
        self._watcher = self.spawn(self._watch_limits())
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
                self.barge_in.cut(self.reply)
            self.say(STT_GOODBYE, hang_up="stt_failed")
            return False
        self.stt = stt
        if self.reply is None:  # (during a reply the caller was listening: nothing of theirs was lost)
            self.say(STT_APOLOGY)
        return True

    def _reopen_stt(self) -> Optional[SttStream]:
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
        self.barge_in.forget_sound()
        if self.state == "user_speaking":
            self._set_state("listening")

    # -- the caller's side --------------------------------------------------------------------

    def on_stt_event(self, event: SttEvent) -> None:
        """One recognizer event (SpeechLikely, SpeechStart, Partial, Final, EndOfTurn) drives the state machine."""
        self._heard_caller(event)
        if isinstance(event, SpeechLikely):
            self.barge_in.maybe_pause()  # cheap to undo: a sound that brings no word plays the reply on
        elif isinstance(event, SpeechStart):
            self._on_speech_start()
        elif isinstance(event, Partial):
            self.events.emit("transcript.partial", text=event.text, tentative=event.tentative)
            tentative_only = event.text == self._partial[0] and event.tentative != self._tentative
            self._tentative = event.tentative
            if tentative_only:
                return  # only the tentative words changed: the caller sees them, nothing acts on them
            if self._speaking() and self.barge_in.caller_spoke(event.text):
                self._barge_in()
            elif event.text.strip():
                self.barge_in.maybe_pause()
            self._on_partial(event.text)
        elif isinstance(event, Final):
            self._on_final(event)
        elif isinstance(event, EndOfTurn):
            self._on_end_of_turn(event)

    def _heard_caller(self, event: SttEvent) -> None:
        """What the caller is doing: activity (for the idle limits) and a sound under way (barge-in)."""
        if isinstance(event, SpeechStart) or (isinstance(event, (Partial, Final)) and event.text.strip()):
            self._last_activity = time.monotonic()
            self._idle_prompted = False
        self.barge_in.heard(event, self._pushed_samples / STT_RATE)

    def _speaking(self) -> bool:
        return self.state in ("responding", "speaking") and self.reply is not None

    def _on_speech_start(self) -> None:
        if self.state == "listening":
            self._set_state("user_speaking")
            self._turn_started = time.monotonic()
        else:
            self.barge_in.maybe_pause()

    def _on_final(self, event: Final) -> None:
        words = [{"word": w, "start": round(t0, 3), "end": round(t1, 3)} for w, t0, t1 in event.words]
        self.events.emit("transcript.final", text=event.text, words=words)
        if not event.text.strip():
            return
        if self._speaking():
            if not self.barge_in.caller_spoke(event.text):
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
        self.record(Turn("user", text))
        self.on_change()
        times = StageTimes(speech_end=self._speech_end, end_of_turn=time.monotonic())
        self._speech_end = None
        if speculation is not None and same_words(speculation.text, text):
            self._start_reply(times, deltas=speculation.replay())
        else:
            if speculation is not None:
                speculation.cancel()  # the caller said more than the attempt was made on
            self._start_reply(times)

    def _barge_in(self) -> None:
        """The caller spoke a word over the reply: it stops, and the caller has the turn."""
        self.barge_in.interrupt()
        self._set_state("user_speaking")
        self._turn_started = time.monotonic()

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
        self.record(Turn("user", keys))
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
        self.stt.flush()  # its Final ends the turn (_on_final)

    def _on_idle(self) -> None:
        if not self._idle_prompted:
            self._idle_prompted = True
            self.say(IDLE_PROMPT)
        else:
            self.say(IDLE_GOODBYE, hang_up="idle")

    def say(self, text: str, hang_up: Optional[str] = None) -> Reply:
        """Speak `text` now, on Parley's own initiative (not the responder's): an idle prompt,
        a notice; it is a reply like any other (barge-in, history, metrics)."""
        async def deltas() -> AsyncIterator[Any]:
            yield text

        self._start_reply(StageTimes(), deltas=deltas())
        reply = self.reply
        if hang_up:  # (an action of the reply from the start: it is performed even if the voice fails)
            reply.actions.append(_HangUp(hang_up))
        return reply

    # -- Parley's side: replies, through the Speaker ------------------------------------------

    def _start_reply(self, times: StageTimes, greeting: bool = False,
                     deltas: Optional[AsyncIterator[Any]] = None) -> None:
        self._cancel_reply()
        if deltas is None:
            deltas = self.responder.start() if greeting else self.responder.respond(list(self.history))
        self.speaker.start(deltas, times)

    def _continue_unfinished(self, pending: PendingTurn) -> None:
        """A resumed session whose last reply was cut off by the drop."""
        heard_words = len(pending.heard_text.split())
        if self.resume_unfinished == "drop" or heard_words >= len(pending.text.split()):
            self.record(Turn("assistant", pending.text, heard_text=pending.heard_text))
            self.save_progress(None)
            return
        self.speaker.resume(pending.text, heard_words, pending.turn)

    def _cancel_reply(self) -> None:
        self.barge_in.end_pause()
        self.speaker.cancel()

    def reply_started(self, reply: Reply) -> None:
        self._set_state("responding")

    def reply_audible(self, reply: Reply) -> None:
        self._set_state("speaking")

    async def reply_played(self, reply: Reply) -> None:
        self._set_state("listening")
        self._last_activity = time.monotonic()  # the caller's silence counts from the end of the reply
        for action in reply.actions:
            await self._perform(action)

    def reply_lost_voice(self, reply: Reply) -> None:
        """The reply ends here, as if interrupted (its queued audio dropped, the history keeping
        the words heard), and the caller has the floor: the state is listening again, so the
        idle watchdog runs."""
        self.barge_in.cut(reply)
        self._set_state("listening")
        self._last_activity = time.monotonic()
        for action in reply.actions:  # what the reply was to do after its text still happens (a hang-up)
            self.spawn(self._perform(action))
        if not reply.actions and reply is not self._tts_apology:
            # Silence after half a sentence leaves the caller guessing; a new stream normally
            # speaks (one that fails too gets no apology of its own: no loop on a dead voice).
            self._tts_apology = self.say(TTS_APOLOGY)

    def save_progress(self, pending: Optional[PendingTurn]) -> None:
        """Record the reply in progress (or none) in the session."""
        self.in_progress = pending
        self.on_change()

    async def _perform(self, action: Any) -> None:
        if action.kind == "handoff":
            target = getattr(action, "target", "")
            self.events.emit("session.handoff", reason=action.reason, **({"target": target} if target else {}))
            if self.transfer is not None and not await self.transfer(action):
                self.say(TRANSFER_FAILED)  # the caller stays on the line with Parley
        elif action.kind == "end_call" and self.hang_up is not None:
            reason = action.reason if isinstance(action, _HangUp) else "assistant_ended"
            self._spawn_detached(self.hang_up(reason))

    # -- helpers --------------------------------------------------------------------------------

    def _set_state(self, state: str) -> None:
        self.state = state

    def record(self, turn: Turn) -> None:
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

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        """A task of this call ended. One that raised is a bug, and it must not leave the call
        wedged: a reply whose own task died could never end (it ends here, like one that lost
        its voice), and a dead limits watcher would leave a silent caller on the line for ever
        (it starts again)."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        self.log.error("a conversation task failed", exc_info=task.exception())
        reply = self.reply
        if reply is not None and self.speaker.is_reply_task(task):
            self.events.emit("error", code="internal_error", message="the reply failed on the gateway and ended",
                             turn=reply.turn)
            self.reply_lost_voice(reply)
            return
        self.events.error("internal_error", "part of the call failed on the gateway; the call goes on")
        if task is self._watcher:
            self._watcher = self.spawn(self._watch_limits())

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

