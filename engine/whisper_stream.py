"""Streaming recognition on Whisper: re-read the turn so far, commit what two readings agree on.

    caller audio ─┬─► Parley's SSM stream (engine/stt.py): SpeechLikely, SpeechStart, EndOfTurn
                  │        │  (its heads decide when speech starts and when a turn ends)
                  └────────┴─► TurnReader ─► readings of the turn's audio (engine/whisper.py, on a
                                   │          worker thread) ─► Partial (stable words + tentative ones), Final
                                   └─► the engine's events, in stream order

The SSM still listens frame by frame, batched with every other stream in the runtime's tick:
it hears a caller start within 40-80 ms (barge-in pauses on that) and its end-of-turn head
judges pauses. Its own words are not used: learned from synthetic voices, they read real
callers at 0.96 WER. Whisper tiny.en reads them at 0.07, but only whole windows, so:

- partials: while the VAD hears speech, every hop of new speech (MIN_HOP_S to HOP_S, by what
  a re-read costs; from the first MIN_PARTIAL_SPEECH_S of speech on: Whisper hallucinates
  "Thank you" on near-silence) the turn so far is re-read; the words on which the last two
  readings agree (LocalAgreement-2) are committed and never taken back; a Partial carries
  them, and as `tentative` the latest reading's words after them (shown at once, confirmed
  or replaced by the next reading). When the VAD hears the speech stop, the turn is read at
  once (a pause reading): no word of it is cut off, so its words are committed at once too
  (the last words of a sentence need not wait for two more re-reads or the Final), and the
  re-reads after it read from that pause on. Partial re-reads never wait behind a pause
  reading: they stop only because no new speech came;
- the end of turn is decided at each pause from three cues: how long the VAD has heard no
  speech, what the pause reading's words say (the turn-completion table, engine/turn.py,
  and Whisper's punctuation) and whether the SSM's end-of-turn head, weighing those words,
  called the end in this pause (Pause.quiet_needed); unfinished words hold the turn open;
- the Final is the pause reading of the whole turn (or one reading when the SSM or a flush
  ends the turn); the EndOfTurn follows it, and any event of the next turn waits behind both.

TurnReader is the logic alone (no threads, no clock), shared by the runtime (a worker thread
reads) and the benchmark (reads inline and books the compute time on a virtual clock): both
readers are in engine/whisper_readers.py, the pause cues in engine/turn_cues.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

from .interface import EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, SttEvent
from .turn import TurnCompletion, load_turns
from .turn_cues import CUT_OFF, FINISHED, UNFINISHED, quiet_needed, reading_says, table_words
from .vad import SPEECH_OFF, SPEECH_ON, WINDOW as VAD_WINDOW, VadStream
from .whisper import MAX_SECONDS, SAMPLE_RATE, _key

HOP_S = 0.32  # new speech between partial re-reads at most (0.5 s halves the CPU, doubles the lag) ...
MIN_HOP_S = 0.12  # ... and at least: a re-read comes after PARTIAL_COST_RATIO times what the last one cost
PARTIAL_COST_RATIO = 4.0  # (as its reader timed it), so a stream's partial re-reads take at most about a
# quarter of a core: where re-reads are cheap (short windows, an idle machine) partials follow
# closely, where they are dear they slow to the full hop. LocalAgreement-2 makes a word wait for
# the first re-read after it and the one after that: the hop plus two readings is most of the lag.
MIN_PARTIAL_S = 1.0  # turn audio before the first partial re-read, where the VAD has heard no speech yet
MIN_PARTIAL_SPEECH_S = 0.4  # ... where it has: this much speech heard by the VAD (pre-roll and pauses
# do not count); a pause reading of less commits nothing (a click read as "you" would stay)
PRE_ROLL_S = 0.5  # read from this long before a detected start (never before the last turn's end):
# the SSM flags speech 20-80 ms into a word on the voices it knows, later on some real ones
KEEP_S = MAX_SECONDS - 1.0  # a turn longer than Whisper's window is read by its last KEEP_S
FINAL, PAUSE, PARTIAL = 0, 1, 2  # reading kinds, in the order a busy reader takes them


@dataclass
class Job:
    """One reading: the turn `turn` of a stream, audio [start, end) in stream samples; `speech`
    the stretches the VAD heard speech in, (start, end) stream samples (for word times)."""

    turn: int
    kind: int  # FINAL, PAUSE or PARTIAL
    audio: np.ndarray
    start: int
    end: int
    requested_at: float  # seconds of stream audio when asked (the benchmark's clock)
    speech: tuple[tuple[int, int], ...] = ()
    seconds: Optional[float] = None  # what reading it cost (CPU or wall seconds), set by who read it
    prefix: tuple[str, ...] = ()  # a partial re-read from the turn's last pause: the words before it
    queued_at: float = 0.0  # perf_counter when handed to a ReadingWorker
    voice_ended: Optional[bool] = None  # a pause reading: whether the pause head heard the voice finish


@dataclass
class Pause:
    """The caller went quiet at `since` (a stream sample); `text` is the reading of the turn up
    to then, once it is in; `says` what its words say about the turn; `ssm_end` whether
    the SSM's end-of-turn head has called the end since; `voice_ended` whether the pause head
    (engine/pause_head.py) heard the voice finish in the reading's audio."""

    since: int
    job: Job
    text: Optional[str] = None
    says: int = 0  # reading_says(text): UNFINISHED, OPEN or FINISHED
    ssm_end: bool = False
    voice_ended: bool = False

    @property
    def heard_end(self) -> bool:
        return self.ssm_end or self.voice_ended

    def quiet_needed(self) -> float:
        return quiet_needed(self.text, self.says, self.heard_end)


class TurnReader:
    """One stream's recognition on Whisper, driven by its audio (VAD) and its SSM's events.

    A turn starts when the VAD or the SSM hears speech. While the VAD hears speech, the turn
    so far is re-read every `hop` of new speech for partials. When the VAD hears it stop, the
    turn so far is read at once (a pause reading), and its words go out as a Partial. If the
    caller stays quiet long enough for what that reading says (Pause.quiet_needed: a hold-off
    when it reads unfinished, shorter when it reads finished, shortest when the SSM's
    end-of-turn head also called the end), the reading becomes the turn's Final, followed by
    EndOfTurn. Speech that resumes first cancels it. The head counts in turns the VAD heard
    only once advise(decoder) has it weigh Whisper's words; alone (its own words) it ends only
    turns the VAD never heard: on real voices it took 57 % of mid-turn pauses for turn ends.

    push(audio) and on_events(ssm events) return the events to send now and queue readings
    through `submit(job)`; on_reading(job, text) returns what a finished reading releases.
    `turns`: the turn-completion table (default the shipped one; None: punctuation alone).
    Not thread-safe on its own: the runtime calls it under the stream's lock.
    """

    def __init__(self, submit: Callable[[Job], None], can_read_partial: Callable[[], bool] = lambda: True,
                 vad: Optional[VadStream] = None, turns: Union[TurnCompletion, None, str] = "shipped") -> None:
        self.submit = submit
        self.can_read_partial = can_read_partial
        self.vad = vad
        self.turns = load_turns() if turns == "shipped" else turns
        self.vad_speaking = False
        self.vad_in_turn = False  # the VAD has heard speech in this turn: it decides the turn's end
        self.pause: Optional[Pause] = None
        self.ssm_end = False  # the SSM's head called the end since the VAD last heard speech
        self.last_turn_end = 0  # stream sample: a turn's pre-roll never reaches into the one before
        self.base = 0  # stream sample of self.audio[0]
        self.audio = np.zeros(0, np.float32)
        self.turn = 0
        self.turn_start: Optional[int] = None  # stream sample where the current turn's audio starts
        self.speech: list[list[int]] = []  # the VAD's stretches of speech in this turn, [start, end or -1]
        self.committed: list[str] = []  # words no partial of this turn takes back
        self.previous: list[str] = []  # the last partial reading's words
        self.tentative: list[str] = []  # the words after the committed ones the last Partial showed
        self.partial_in_flight = False
        self.read_through = 0  # stream sample: the turn has been read (or sent for reading) up to here
        self.hop = HOP_S  # new speech before the next partial re-read (see PARTIAL_COST_RATIO)
        self._table_text, self._table_words = "", []
        self.ssm_weighs_words = False  # see advise()
        self.anchor: tuple[int, tuple[str, ...]] = (0, ())  # (stream sample, words read before it)
        # Events in stream order; a turn's final reading holds back everything after it:
        self.outbox: list[Union[SttEvent, _FinalSlot]] = []

    @property
    def samples(self) -> int:
        return self.base + len(self.audio)

    def advise(self, decoder) -> None:
        """Let the SSM's decoder (engine.stt.StreamDecoder) weigh this reader's words with the
        turn table instead of its own (StreamDecoder.words_source); only then do its turn ends
        count as a cue in turns the VAD heard (Pause.ssm_end). The runtime and the benchmark
        call it once per stream, after both are made."""
        decoder.words_source = self.words_for_table
        self.ssm_weighs_words = True

    def words_for_table(self) -> list[str]:
        """The latest reading of the turn under way, spelled for the turn-completion table: what
        the SSM's end-of-turn head weighs its pauses with (StreamDecoder.words_source), instead
        of its own words, which on real voices are mostly wrong."""
        text = " ".join(self.previous)
        if text != self._table_text:
            self._table_text, self._table_words = text, table_words(text)
        return self._table_words

    def push(self, audio: np.ndarray) -> list[SttEvent]:
        self.audio = np.concatenate([self.audio, audio.astype(np.float32, copy=False)])
        out = self._listen(audio) if self.vad is not None else []
        out += self._maybe_end_turn()
        self._maybe_read_partial()
        self._trim()  # last: a start the VAD just heard in this audio keeps its pre-roll
        return out

    def _listen(self, audio: np.ndarray) -> list[SttEvent]:
        """The VAD's view of the new audio: a sound's start opens a turn if none is under way
        (or cancels a pause); its end starts a pause reading."""
        out: list[SttEvent] = []
        done = self.vad.windows
        for k, p in enumerate(self.vad.push(audio), start=done):
            at = k * VAD_WINDOW
            if not self.vad_speaking and p >= SPEECH_ON:
                self.vad_speaking = True
                self.pause = None
                self.ssm_end = False
                if self.turn_start is None:
                    self._start_turn(at / SAMPLE_RATE)
                    out += self._send([SpeechStart(t=at / SAMPLE_RATE)])
                self.vad_in_turn = True
                self.speech.append([at, -1])
                self.read_through = max(self.read_through, at)  # the next partial reads HOP_S of new speech
            elif self.vad_speaking and p < SPEECH_OFF:
                self.vad_speaking = False
                if self.speech and self.speech[-1][1] < 0:
                    self.speech[-1][1] = at
                if self.turn_start is not None and self.vad_in_turn:
                    self.pause = Pause(at + VAD_WINDOW, self._job(PAUSE, self.turn_start), ssm_end=self.ssm_end)
                    self.read_through = self.samples
                    self.submit(self.pause.job)
        return out

    def _maybe_end_turn(self) -> list[SttEvent]:
        pause = self.pause
        if pause is None or pause.text is None or self.vad_speaking:
            return []
        quiet = pause.quiet_needed()
        if self.samples - pause.since < quiet * SAMPLE_RATE:
            return []
        self.pause = None
        text = pause.text
        confidence = (0.0 if not text else 0.95 if pause.heard_end and pause.says != UNFINISHED
                      else 0.9 if pause.says == FINISHED else 0.5)
        self._close_turn()
        final = [Final(text, word_times(text.split(), pause.job.start, pause.since, pause.job.speech))]
        return self._send((final if text else []) + [EndOfTurn(confidence=confidence)])

    def on_events(self, events: list[SttEvent]) -> list[SttEvent]:
        """The SSM's events for the audio pushed so far, in order."""
        out: list[SttEvent] = []
        for event in events:
            if isinstance(event, SpeechStart):
                # (a start the SSM hears late, in speech already read as a turn, opens none)
                if self.turn_start is None and event.t * SAMPLE_RATE >= self.last_turn_end:
                    self._start_turn(event.t)
                    out += self._send([event])
            elif isinstance(event, SpeechLikely):
                out += self._send([event])
            elif isinstance(event, EndOfTurn):
                if not self.vad_in_turn:
                    out += self._end_turn(event)
                elif event.confidence > 0 and not self.vad_speaking and self.ssm_weighs_words:
                    # The head heard an end in this pause: one cue of three (Pause.quiet_needed)
                    self.ssm_end = True
                    if self.pause is not None:
                        self.pause.ssm_end = True
                        out += self._maybe_end_turn()
            # Partial and Final: the SSM's words give way to Whisper's readings
        return out

    def flush(self) -> list[SttEvent]:
        """The audio ended for now: a Final for the turn under way (no end-of-turn claim)."""
        return self._end_turn(None)

    def on_reading(self, job: Job, text: str) -> list[SttEvent]:
        if job.kind == PARTIAL:
            self.partial_in_flight = False
            if job.seconds is not None:
                self.hop = min(HOP_S, max(MIN_HOP_S, PARTIAL_COST_RATIO * job.seconds))
            return self._on_partial_reading(" ".join(job.prefix + (text,))) if job.turn == self.turn else []
        if job.kind == PAUSE:
            if self.pause is not None and self.pause.job is job:
                self.pause.text = text
                self.pause.says = reading_says(text, self.turns)
                self.pause.voice_ended = bool(job.voice_ended)
                # The speech stopped before this reading: no word of it is cut off, so all are stable
                words = text.split()
                stable = words if self._speech_heard(job) >= MIN_PARTIAL_SPEECH_S * SAMPLE_RATE else []
                out = self._commit(stable, words)
                if words and self.committed == words:  # partials go on from here (see _maybe_read_partial)
                    self.anchor = (job.speech[-1][1] if job.speech else job.end, tuple(words))
                return out + self._maybe_end_turn()
            if job.turn == self.turn and self.turn_start is not None:
                return self._on_partial_reading(text)  # the caller went on: as good as a partial reading
            return []
        slot = next(item for item in self.outbox if isinstance(item, _FinalSlot) and item.turn == job.turn)
        slot.events = [Final(text, word_times(text.split(), job.start, job.end, job.speech))] if text else []
        if slot.end_of_turn is not None:
            slot.events.append(slot.end_of_turn)
        return self._release()

    # -- turns --

    def _start_turn(self, t: float) -> None:
        self.turn += 1
        self.turn_start = max(self.base, self.last_turn_end, int((t - PRE_ROLL_S) * SAMPLE_RATE))
        self.vad_in_turn = False
        self.pause = None
        self.speech = []
        self.committed, self.previous, self.tentative = [], [], []
        self.anchor = (0, ())
        self.read_through = self.turn_start
        self.hop = MIN_HOP_S  # a turn's first re-reads are short, so cheap

    def _close_turn(self) -> int:
        start, self.turn_start = self.turn_start, None
        self.last_turn_end = self.samples
        self.vad_in_turn = False
        self.pause = None
        self.ssm_end = False
        return start

    def _end_turn(self, end_of_turn: Optional[EndOfTurn]) -> list[SttEvent]:
        """A turn ends without a pause reading (the SSM's call, or a flush): read it whole."""
        if self.turn_start is None:  # nothing under way (a flush in silence, an end without a start)
            return self._send([end_of_turn]) if end_of_turn is not None else []
        job = self._job(FINAL, self.turn_start)
        self._close_turn()
        self.outbox.append(_FinalSlot(self.turn, end_of_turn))
        self.submit(job)
        return []

    def _send(self, events: list[SttEvent]) -> list[SttEvent]:
        self.outbox += events
        return self._release()

    def _release(self) -> list[SttEvent]:
        """The events at the front of the outbox that wait for no reading."""
        out: list[SttEvent] = []
        while self.outbox:
            item = self.outbox[0]
            if isinstance(item, _FinalSlot):
                if item.events is None:
                    break
                out += item.events
            else:
                out.append(item)
            self.outbox.pop(0)
        return out

    # -- partials --

    def _maybe_read_partial(self) -> None:
        """A re-read once `hop` of new speech came in: never while the VAD hears a pause (the
        pause reading reads the turn up to it), and never queued behind another partial."""
        if self.turn_start is None or self.partial_in_flight or (self.vad_in_turn and not self.vad_speaking):
            return
        enough = (self._speech_heard() >= MIN_PARTIAL_SPEECH_S * SAMPLE_RATE if self.vad_in_turn
                  else self.samples - self.turn_start >= MIN_PARTIAL_S * SAMPLE_RATE)
        if not enough or self.samples - self.read_through < self.hop * SAMPLE_RATE or not self.can_read_partial():
            return
        self.partial_in_flight = True
        self.read_through = self.samples
        # Read from the last pause whose reading is committed whole, not from the turn's start:
        # those words are settled, and a shorter window costs less (so the hop stays short)
        at, words = self.anchor
        start = max(self.turn_start, at) if words else self.turn_start
        job = self._job(PARTIAL, start)
        if words and job.start == start:
            job.prefix = words
        elif words:  # (a turn longer than KEEP_S: its window starts later anyway)
            job = self._job(PARTIAL, self.turn_start)
        self.submit(job)

    def _speech_heard(self, job: Optional[Job] = None) -> int:
        """Samples of speech the VAD heard in this turn (up to `job`'s end)."""
        spans = job.speech if job is not None else [(a, b if b >= 0 else self.samples) for a, b in self.speech]
        return sum(b - a for a, b in spans)

    def _on_partial_reading(self, text: str) -> list[SttEvent]:
        words = text.split()
        return self._commit(common_prefix(self.previous, words), words)

    def _commit(self, stable: list[str], words: list[str]) -> list[SttEvent]:
        """Commit `stable` if it extends what is committed; `words` is the latest reading. A
        Partial goes out when the committed words grew or the tentative ones (the reading's
        words after them, shown before a second reading confirms them) changed."""
        self.previous = words
        while stable and stable[-1].endswith(CUT_OFF):  # "a..." "dis-": a word the window cut
            stable = stable[:-1]
        grew = len(stable) > len(self.committed) and len(common_prefix(stable, self.committed)) == len(self.committed)
        if grew:
            self.committed = self.committed + stable[len(self.committed):]  # as the words went out before
        tentative = tentative_words(self.committed, words)
        if not grew and tentative == self.tentative:
            return []
        self.tentative = tentative
        return self._send([Partial(" ".join(self.committed), " ".join(tentative))])

    # -- audio --

    def _job(self, kind: int, start: int) -> Job:
        start = max(start, self.samples - int(KEEP_S * SAMPLE_RATE), self.base)
        audio = self.audio[start - self.base:].copy()
        speech = tuple((a, b if b >= 0 else self.samples) for a, b in self.speech)
        return Job(self.turn, kind, audio, start, self.samples, self.samples / SAMPLE_RATE, speech)

    def _trim(self) -> None:
        """Keep the turn under way (at most KEEP_S) or, between turns, the pre-roll."""
        keep_from = self.samples - int((KEEP_S if self.turn_start is not None else PRE_ROLL_S + 0.2) * SAMPLE_RATE)
        if self.turn_start is not None:
            keep_from = max(keep_from, min(self.turn_start, self.samples))
        drop = keep_from - self.base
        if drop > SAMPLE_RATE:  # trim in whole seconds, not on every push
            self.audio = self.audio[drop:]
            self.base += drop


@dataclass
class _FinalSlot:
    """A turn's place in the outbox until its final reading is in."""

    turn: int
    end_of_turn: Optional[EndOfTurn]
    events: Optional[list[SttEvent]] = None


def common_prefix(a: list[str], b: list[str]) -> list[str]:
    """The words both start with (compared without case and punctuation), as `b` writes them."""
    n = 0
    while n < len(a) and n < len(b) and _key(a[n]) == _key(b[n]):
        n += 1
    return b[:n]


def tentative_words(committed: list[str], words: list[str]) -> list[str]:
    """A reading's words after the committed ones, when it starts with them (else none: it
    reads the turn differently, and the next reading decides); without a last word the
    window cut off."""
    if len(common_prefix(committed, words)) < len(committed):
        return []
    tail = words[len(committed):]
    return tail[:-1] if tail and tail[-1].endswith(CUT_OFF) else tail


def spread_words(words: list[str], start: float, end: float) -> list[tuple[str, float, float]]:
    """Word times for a reading without timestamps: the span shared by characters. An estimate:
    the gateway uses only the last word's end (when the caller stopped)."""
    if not words:
        return []
    total = sum(len(w) + 1 for w in words)
    out, t = [], start
    for word in words:
        t1 = t + (end - start) * (len(word) + 1) / total
        out.append((word, round(t, 3), round(t1, 3)))
        t = t1
    return out


def word_times(words: list[str], start: int, end: int,
               speech: tuple[tuple[int, int], ...] = ()) -> list[tuple[str, float, float]]:
    """Word times (seconds) for a reading of stream samples [start, end): spread over the
    stretches in which the VAD heard speech when there are any (not over the pre-roll and the
    pauses), else over the whole span (spread_words)."""
    spans = [(max(a, start), min(b, end)) for a, b in speech if min(b, end) > max(a, start)]
    if not words or not spans:
        return spread_words(words, start / SAMPLE_RATE, end / SAMPLE_RATE)
    voiced = [(b - a) / SAMPLE_RATE for a, b in spans]
    total = sum(voiced)
    stamps = spread_words(words, 0.0, total)

    def at(t: float, end: bool) -> float:  # a time on the voiced clock -> seconds of stream audio
        for (a, _), length in zip(spans, voiced):  # (a word ends in the stretch it starts the next one in)
            if t < length - 1e-6 or (end and t <= length + 1e-6):
                return a / SAMPLE_RATE + t
            t -= length
        return spans[-1][1] / SAMPLE_RATE

    return [(w, round(at(t0, False), 3), round(at(t1, True), 3)) for w, t0, t1 in stamps]
