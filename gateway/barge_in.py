"""Barge-in: the caller talking over Parley's reply, in two steps (pause, then continue or interrupt).

(1) Pause. The caller makes a sound over the reply (the recognizer's SpeechLikely, SpeechStart
or any partial text) and the echo suppressor hears the caller's own voice over Parley's (asked
on every inbound frame for ONSET_AUDIBLE_S after the onset: a soft onset comes through the
suppressor later): the reply is paused (the pacer holds; the next 20 ms frame is silence) and
`response.paused` is sent.

(2a) Interrupt. If the recognizer hears a word (letters with a vowel: "no", "wait" — not the
"s" or "o" it can make of a cough, a breath or residual echo), the queued audio is dropped,
the TTS stream and the responder are cancelled, `response.interrupted {heard_text, played_ms}`
is sent and the history keeps only the words the caller heard (from the TTS word marks and
the pacer's played-sample count, which stopped at the pause).

(2b) Continue. A cough or an "mm-hm" yields no word: once FALSE_INTERRUPTION_S have passed and
the sound has ended (its Final or end of turn), or after MAX_PAUSE_S in any case, the reply
plays on from where it paused (`response.continued {paused_ms, rewound_ms}`).

A paused reply's last frames are still on their way when the pause begins (the network, the
client's jitter buffer: ~100 ms). A client that silences them at once on `response.paused`
says so (`playback.cut {turn}`; the demo page does); the reply then counts as heard only up
to the audio sent one playout delay (the page's latest `browser_playout_ms`) before the
pause, and a reply that plays on is rewound by as much, so the caller hears no gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any, Awaitable, Callable, Optional

from engine.interface import EndOfTurn, Final, SpeechLikely, SpeechStart

from .echo_suppressor import EchoSuppressor
from .events import BadClientMessage, EventChannel
from .pacer import SAMPLE_RATE as PACER_RATE
from .pacer import PacedAudioTrack
from .reply import Reply, Speaker

WORD = re.compile(r"[a-z']*[aeiouy][a-z']*")  # a recognized token that can be a word (has a vowel)
FALSE_INTERRUPTION_S = 0.6  # a reply paused for the caller's sound plays on if no word follows this soon
ONSET_AUDIBLE_S = 0.2  # after a SpeechLikely or SpeechStart, each inbound frame asks whether the caller is audible yet
MAX_PAUSE_S = 2.0  # ... and once the sound has ended; a wordless sound longer than this is not a turn


def has_word(text: str) -> bool:
    return any(len(token) >= 2 and WORD.fullmatch(token) for token in text.lower().split())


class BargeIn:
    """Pauses, continues and interrupts the Speaker's reply as the caller's sounds come in.

    `speaking()` says whether the reply's audio is playing (the conversation's state); `spawn`
    runs a task the conversation cancels when the call closes."""

    def __init__(self, speaker: Speaker, pacer: PacedAudioTrack, events: EventChannel, echo: EchoSuppressor,
                 speaking: Callable[[], bool], spawn: Callable[[Awaitable[Any]], asyncio.Task]) -> None:
        self.speaker, self.pacer, self.events, self.echo = speaker, pacer, events, echo
        self.speaking = speaking
        self.spawn = spawn
        self.paused_at: Optional[float] = None  # the reply was paused for the caller's sound (monotonic)
        self._cut_by_client = False  # ... and the client silenced the audio then on its way (playback.cut)
        self._caller_quiet = asyncio.Event()  # cleared from SpeechStart until the Final or end of turn
        self._caller_quiet.set()
        self._onset_at: Optional[float] = None  # the last SpeechLikely or SpeechStart (s of caller audio pushed)

    # -- the caller's sound ----------------------------------------------------------------------

    def heard(self, event: Any, heard_s: float) -> None:
        """A recognizer event, `heard_s` seconds into the caller's audio: track a sound under way."""
        if isinstance(event, (SpeechLikely, SpeechStart)):
            self._onset_at = heard_s
        if isinstance(event, SpeechStart):
            self._caller_quiet.clear()
        elif isinstance(event, (Final, EndOfTurn)):
            self._caller_quiet.set()

    def on_audio(self, heard_s: float) -> None:
        """Another inbound frame: a sound that started lately may only now be audible over the echo."""
        if self._onset_at is not None and heard_s - self._onset_at < ONSET_AUDIBLE_S:
            self.maybe_pause()

    def forget_sound(self) -> None:
        """The recognizer stream that heard the sound failed: no Final or end of turn will come."""
        self._onset_at = None
        self._caller_quiet.set()

    def caller_spoke(self, text: str) -> bool:
        """A word, and the caller's own voice audible over Parley's (not its echo's residue)."""
        return has_word(text) and self.echo.caller_audible()

    # -- pause and continue -------------------------------------------------------------------

    def maybe_pause(self) -> None:
        """The caller may be starting to talk over the reply: silence it from the next frame,
        and play on if no word follows within FALSE_INTERRUPTION_S."""
        if not self.speaking() or self.paused_at is not None or not self.echo.caller_audible():
            return  # (a soft onset is often not yet audible over the echo: on_audio asks again each frame)
        self.paused_at = time.monotonic()
        self.pacer.hold()
        self.events.emit("response.paused", turn=self.speaker.reply.turn)
        self.spawn(self._play_on_unless_words(self.speaker.reply))

    async def _play_on_unless_words(self, reply: Reply) -> None:
        await asyncio.sleep(FALSE_INTERRUPTION_S)
        # A caller still making sound may yet say a word (the pause comes on the onset, before
        # the recognizer has a character): play on once the sound has ended.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._caller_quiet.wait(), MAX_PAUSE_S - FALSE_INTERRUPTION_S)
        if self.speaker.reply is reply and self.paused_at is not None:
            paused_ms = round((time.monotonic() - self.paused_at) * 1000)
            rewound = self.end_pause(rewind_samples=min(self._unheard_samples(), reply.played(self.pacer)))
            self.events.emit("response.continued", turn=reply.turn, paused_ms=paused_ms,
                             rewound_ms=round(rewound * 1000 / PACER_RATE))

    def end_pause(self, rewind_samples: int = 0) -> int:
        """The pacer plays on (after resending `rewind_samples`); returns the samples rewound."""
        self.paused_at = None
        self._cut_by_client = False
        return self.pacer.release(rewind_samples)

    def on_playback_cut(self, message: dict) -> None:
        """The page silenced a paused reply's audio still on its way (`playback.cut {turn}`)."""
        turn = message.get("turn")
        if type(turn) is not int or turn < 1:
            raise BadClientMessage("playback.cut needs 'turn': the positive integer of a response.paused")
        reply = self.speaker.reply
        if reply is not None and reply.turn == turn and self.paused_at is not None:
            self._cut_by_client = True  # (a cut that crossed the reply's end or interruption is moot)

    def _unheard_samples(self) -> int:
        """Of the audio sent before the pause, how much the client's cut kept from the caller."""
        if not self._cut_by_client or self.speaker.playout_delay_s is None:
            return 0
        return round(self.speaker.playout_delay_s * PACER_RATE)

    # -- interrupt ------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """The caller spoke a word over the reply: silence now, keep only what was heard."""
        reply = self.speaker.reply
        heard, played_ms = self.cut(reply)
        self.events.emit("response.interrupted", turn=reply.turn, heard_text=heard, played_ms=played_ms)

    def cut(self, reply: Reply) -> tuple[str, int]:
        """Stop the reply now (an interruption, or its voice or the caller's recognizer failing);
        the history keeps the words the caller heard. Returns (heard text, played ms)."""
        heard = self.speaker.cut(reply, self._unheard_samples())
        self.end_pause()
        return heard
