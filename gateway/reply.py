"""Parley's side of a conversation: one reply at a time, responder -> TTS -> pacer.

A reply streams end to end: responder text deltas go to the TTS stream as they arrive, and
TTS audio goes to the pacer as it is made, so Parley starts speaking on the reply's first
phrase, not its last. The reply keeps its word marks against the pacer's played samples, so
what the caller heard is known at any moment (a barge-in, a dropped connection).

The reply is over when the pacer has sent its last sample (`PacedAudioTrack.until_played`),
when it is cut (gateway/barge_in.py), or when its voice fails (its TTS stream breaks, or none
can be opened: `tts_failed`). Responder failures and timeouts are spoken as an apology with
an `error` event, never silence. A reply that stops moving (no new audio and none played for
`stall_s`: a TTS stream that never ends, a pacer nobody reads) ends too (`reply_stalled`), so
no call waits for it for ever.

Stage times: `metrics.turn` breaks each reply's latency down by stage, up to the first frame
sent. The browser's playout start is the last stage: the page reports it (`playout.started
{turn}`), and a second `metrics.turn` carries `browser_playout_ms`, measured on the server's
clock from the first frame sent to the report's arrival (so it includes the report's own trip
back).

The Speaker owns the reply; the conversation (its `ReplyHost`) owns the turn state, the
history and the session record, and is told when a reply starts, becomes audible, plays out
or loses its voice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Protocol

from engine.interface import Audio, TtsStream, WordMark

from .dialog import PendingTurn, Turn
from .events import BadClientMessage, EventChannel
from .pacer import SAMPLE_RATE as PACER_RATE
from .pacer import PacedAudioTrack
from .responders import ResponderError

PROGRESS_EVERY_S = 0.25  # how often the played position of a reply is saved to the session
PLAYOUT_REPORTS_KEPT = 8  # replies whose first frame awaits the page's playout.started; older ones are forgotten
MAX_PLAYOUT_DELAY_S = 0.4  # a longer playout report is a stalled page, not its audio path
APOLOGY = "Sorry, I'm having trouble answering right now."
REPLY_STALL_S = 10.0  # a reply neither making nor playing audio this long is stuck (well over a barge-in pause, barge_in.MAX_PAUSE_S)


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


@dataclass
class Reply:
    """One assistant reply: its text so far, where its audio sits in the pacer, its word marks."""

    turn: int
    text: str = ""
    responder_done: bool = False
    tts_finished: asyncio.Event = field(default_factory=asyncio.Event)  # its TTS stream gave all its audio
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

    @property
    def end_sample(self) -> Optional[int]:
        """The pacer sample after the reply's last audio written (None before any audio)."""
        return None if self.start_sample is None else self.start_sample + self.written


class ReplyHost(Protocol):
    """What a Speaker needs from its conversation."""

    log: logging.Logger | logging.LoggerAdapter

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task: ...

    def record(self, turn: Turn) -> None:
        """A finished turn, into the history."""

    def save_progress(self, pending: Optional[PendingTurn]) -> None:
        """The reply in progress (or none), into the session record."""

    def reply_started(self, reply: Reply) -> None:
        """A new reply is under way (before its voice is opened, which may fail at once)."""

    def reply_audible(self, reply: Reply) -> None:
        """The reply's first audio went to the pacer."""

    async def reply_played(self, reply: Reply) -> None:
        """The reply played out in full and is recorded; its actions are the host's."""

    def reply_lost_voice(self, reply: Reply) -> None:
        """The reply's TTS failed: the host cuts it (the history keeps the words heard)."""


class Speaker:
    """Speaks one reply at a time into the pacer, and knows how much of it has played."""

    def __init__(self, host: ReplyHost, open_tts: Callable[[], TtsStream], pacer: PacedAudioTrack,
                 events: EventChannel, turns: int = 0, stall_s: float = REPLY_STALL_S) -> None:
        self.host = host
        self.stall_s = stall_s
        self.open_tts = open_tts
        self.pacer = pacer
        self.events = events
        self.reply: Optional[Reply] = None
        # The last reply's `turn` number. It goes on across a resume (the session keeps it), so a
        # client never sees one number name two replies, and a resumed reply keeps its own.
        self.turns = turns
        self.playout_delay_s: Optional[float] = None  # the page's latest browser_playout_ms, in s
        self._tts: Optional[TtsStream] = None  # the current reply's TTS stream
        self._task: Optional[asyncio.Task] = None  # the current reply's responder -> playback task
        self._awaiting_playout: dict[int, float] = {}  # turn -> when its first frame was sent (monotonic)

    # -- starting a reply --------------------------------------------------------------------

    def start(self, deltas: AsyncIterator[Any], times: StageTimes) -> Reply:
        """Speak the responder's `deltas` (text, then actions), after cancelling any reply under way."""
        self.cancel()
        reply = self._new_reply(times=times)
        self._task = self.host.spawn(self._produce(reply, deltas))
        return reply

    def resume(self, text: str, heard_words: int, turn: int = 0) -> None:
        """Speak the rest of a reply cut off by a dropped connection, from its first unheard word,
        under its own `turn` number (0: unknown, a new one)."""
        reply = self._new_reply(text=text, responder_done=True, skipped_words=heard_words, turn=turn)
        self.events.emit("response.resumed", turn=reply.turn, from_word=heard_words)
        if not self._open_voice(reply):
            return
        self._tts.push_text(" ".join(text.split()[heard_words:]))
        self._tts.end()
        self._task = self.host.spawn(self._finish(reply))

    def _new_reply(self, turn: int = 0, **fields: Any) -> Reply:
        self.turns = max(self.turns, turn) if turn else self.turns + 1
        reply = self.reply = Reply(turn or self.turns, **fields)
        self.host.reply_started(reply)
        return reply

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
            self.host.log.warning("responder failed", extra={"error": code})
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
        self.save_progress(reply)

    def save_progress(self, reply: Optional[Reply]) -> None:
        """Record the reply in progress (its text and the words heard so far), or none."""
        if reply is None:
            self.host.save_progress(None)
        else:
            heard, played_ms = reply.heard(self.pacer)
            self.host.save_progress(PendingTurn(reply.text, played_ms, heard, turn=reply.turn))

    # -- its voice -------------------------------------------------------------------------------

    def _open_voice(self, reply: Reply) -> bool:
        """Open the reply's TTS stream; False (the reply is over) when none can be had."""
        try:
            self._tts = self.open_tts()
        except Exception as exc:  # CapacityError: every TTS slot is taken, or the engine is closing
            self._lost_voice(reply, exc)
            return False
        self.host.spawn(self._play(reply, self._tts))
        return True

    async def _play(self, reply: Reply, tts: TtsStream) -> None:
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
                self._lost_voice(reply, exc)
            return
        if tts is self._tts:
            reply.tts_finished.set()

    def _lost_voice(self, reply: Reply, exc: Exception, code: str = "tts_failed",
                    message: str = "speech synthesis failed: the reply ended early",
                    log_line: str = "speech synthesis failed: the reply ends") -> None:
        """The reply lost its voice: it ends here (the host decides on an apology, in a new voice)."""
        if self.reply is not reply:
            return  # already over (a barge-in, a newer reply)
        self.host.log.warning(log_line, extra={"error": type(exc).__name__, "code": code, "turn": reply.turn})
        self.events.emit("error", code=code, message=message, turn=reply.turn)
        self.host.reply_lost_voice(reply)

    def _write_audio(self, reply: Reply, audio: Audio) -> None:
        if reply.start_sample is None:
            reply.start_sample = self.pacer.write_position
            reply.rate = audio.sample_rate
            if reply.times.first_audio is None:
                reply.times.first_audio = time.monotonic()
            self.events.emit("response.audio.start", turn=reply.turn)
            self.host.reply_audible(reply)
        self.pacer.write(audio.pcm, audio.sample_rate)
        reply.written = self.pacer.write_position - reply.start_sample

    # -- playing out -----------------------------------------------------------------------------

    async def _finish(self, reply: Reply) -> None:
        """Wait until the reply's audio has played out, then record it as heard in full."""
        if not await self._while_saving_progress(reply, self._played_out(reply)):
            return  # its audio was flushed: whoever cut the reply has recorded it
        if reply.times.first_audio is not None:  # (an empty greeting plays nothing)
            self.events.emit("response.audio.end", turn=reply.turn)
        if reply.text:
            self.host.record(Turn("assistant", reply.text, heard_text=reply.text))
        self.reply = None
        self.save_progress(None)
        await self.host.reply_played(reply)

    async def _played_out(self, reply: Reply) -> bool:
        """True once the TTS stream has ended and the pacer has sent its last sample."""
        await reply.tts_finished.wait()
        if reply.end_sample is None:
            return True
        return await self.pacer.until_played(reply.end_sample)

    async def _while_saving_progress(self, reply: Reply, done: Awaitable[bool]) -> bool:
        """Await `done`, saving how far the reply has played every PROGRESS_EVERY_S meanwhile
        (a dropped connection resumes from there). False if the reply was cut meanwhile, or
        stalled: neither written nor played on for `stall_s`."""
        waiter = asyncio.ensure_future(done)
        moved_at, position = time.monotonic(), None
        try:
            while not (await asyncio.wait({waiter}, timeout=PROGRESS_EVERY_S))[0]:
                self.save_progress(reply)
                now, where = time.monotonic(), (reply.written, self.pacer.played_samples, len(reply.marks))
                if where != position:  # (a barge-in pause holds it MAX_PAUSE_S at most, well under stall_s)
                    moved_at, position = now, where
                elif now - moved_at > self.stall_s:
                    self._lost_voice(reply, TimeoutError("no audio made or played"), "reply_stalled",
                                     f"the reply stopped: no audio made or played for {self.stall_s:g} s",
                                     "the reply stalled: it ends")
                    return False
            return waiter.result()
        finally:
            waiter.cancel()

    def on_frame_sent(self) -> None:
        """Called as each frame is sent: the one carrying the reply's first audio completes the
        server's stages (metrics.turn), timed exactly, before any browser can have heard it."""
        reply = self.reply
        if (reply is None or reply.times.first_frame is not None or reply.start_sample is None
                or self.pacer.played_samples <= reply.start_sample):
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
            self.playout_delay_s = playout_ms / 1000

    # -- ending a reply early --------------------------------------------------------------------

    def cut(self, reply: Reply, unheard_samples: int = 0) -> tuple[str, int]:
        """Stop the reply now; the history keeps the words the caller heard, less the last
        `unheard_samples` sent (see Reply.heard). Returns (heard text, played ms)."""
        heard, played_ms = reply.heard(self.pacer, unheard_samples)
        self.pacer.flush()
        self.cancel()
        if reply.text:
            self.host.record(Turn("assistant", reply.text, heard_text=heard))
        self.reply = None
        self.save_progress(None)
        return heard, played_ms

    def is_reply_task(self, task: asyncio.Task) -> bool:
        """Whether `task` is the current reply's responder -> playback task."""
        return task is self._task

    def cancel(self) -> None:
        """Stop the reply's TTS and responder (its queued audio stays: cut() drops it)."""
        tts, self._tts = self._tts, None
        if tts is not None:
            tts.cancel()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # (a reply ending itself, e.g. with no voice to be had, just returns)
