"""Streaming speech-to-text: an SSM encoder with a CTC head and an end-of-turn head.

    16 kHz audio ─► log-mel (10 ms) ─► stack 4 frames (causal stride-4 subsampling, 40 ms)
      ─► Linear + GELU ─► RecurrentStack (RG-LRU blocks) ─┬► CTC head: characters
                                                          └► end-of-turn head: speech / pause / end

One model, one fixed-size state per stream: `forward` runs a whole utterance (training,
offline), `step` runs one 40 ms frame (streaming); both give the same outputs.
`StreamDecoder` turns one stream's per-frame outputs into the engine's events (Partial,
Final with word times, SpeechLikely, SpeechStart, EndOfTurn); `Recognizer` is the single-stream path
around it, engine/runtime/ the batched one. Partials and the Final come from the prefix beam
search with the word language model (engine/beam.py, engine/lm.py), which cut held-out WER
from 0.61 to 0.37 (MODEL_CARD.md); greedy CTC still decides when speech starts, and fills a
partial while the beam has no word yet (the first letter is what a barge-in pauses on).
Whether a pause ends the turn is the end-of-turn head's call together with what was said so
far (engine/turn.py: "my number is" leaves a turn open however long the caller draws breath).

Over 400 lines, kept as one module, as openai/whisper keeps model and decoding apart but each
whole: the model, its frozen CPU form and the StreamDecoder that reads its per-frame outputs
share one frame layout (FrameOutput, the head's classes, the 40 ms stride), and the offline
helpers at the end are the same decoding run over a whole utterance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import weights
from .audio import (FRAMES_PER_STEP, N_MELS, STEP_SAMPLES, SAMPLE_RATE, FrameStacker, StreamingLogMel,
                    to_finite_float, to_float)
from .beam import CtcBeamSearch
from .interface import EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, SttEvent
from .inference import FrozenStack, PackedLinear, cached_freeze, check_int8_kernel, gelu_for, int8_supported
from .lm import SHIPPED_LM, NgramLm, load_lm
from .ssm import BlockState, RecurrentStack
from .turn import SHIPPED_TURNS, TurnCompletion, load_turns

VOCAB = ["<blank>", " ", "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
BLANK = 0
CHAR_TO_ID = {c: i for i, c in enumerate(VOCAB)}
SPEECH, PAUSE, END_OF_TURN = 0, 1, 2  # end-of-turn head classes, per 40 ms frame
FRAME_S = STEP_SAMPLES / SAMPLE_RATE  # 0.04 s per model frame

PARTIAL_EVERY_FRAMES = 2  # partial transcripts at most every 80 ms
END_OF_TURN_THRESHOLD = 0.9  # P(end of turn) that closes a turn when the head decides alone (turns=None)
TURN_END_PROBABILITY = 0.98  # ... or, with the turn-completion table, P(end) from the head's log odds plus
TURN_TEXT_WEIGHT = 1.5  # this weight times the table's log odds, clipped to +-TURN_TEXT_CLIP (so a transcript
TURN_TEXT_CLIP = 3.0  # misheard into a "complete" one cannot end a turn the head doubts), after at least
TURN_END_QUIET_FRAMES = 3  # 120 ms without speech. Weight, clip and quiet frames chosen first; the threshold
# later, together with the beam width (engine/beam.py), on the selection
# folders' 632 mid-turn pauses of 0.4-0.8 s (120 files each), the target's own measure: width 16 and
# 0.97 took 31 of them for turn ends at 230-250 ms p50, width 32 and 0.98 take 26 at 225-250 ms (its
# better partials read "complete" more often: 33 at 0.97); MODEL_CARD.md, "Decoding and the turn rule"
SPEECH_PROBABILITY = 0.9  # the head's P(speech) on one frame that starts speech at once, 20-30 ms
# into a word: a barge-in pauses on it (the export guard checks noise and buzz never reach it)
LIKELY_PROBABILITY = 0.8  # SpeechLikely: P(speech) this high, or any CTC token (the word boundary " "
# comes first, often 40-80 ms before P(speech) reaches 0.9). On a recorded bench call the first
# of them came 40-120 ms into the caller's sound where SpeechStart took 60-200 ms; 4 of 145
# non-speech clips (loud line noise) reach 0.8, none emits a token, none reaches 0.9
LIKELY_RESET_PROBABILITY = 0.5  # ... again only once P(speech) has fallen below this, with no token
SPEECH_START_FRAMES = 2  # or: consecutive non-blank/speech frames once a character is recognised
WORDLESS_END_FRAMES = 12  # a sound that brought no word closes after 0.48 s without speech
SILENT_TURN_END_FRAMES = 30  # 1.2 s without speech after words ends the turn even when the end-of-turn
# head is unsure (a voice unlike those it learned); mid-turn pauses are 0.3-0.9 s
CONTINUATION_FRAMES = 25  # speech that starts within 1 s of an end of turn goes on the turn that ended, for
# the turn table: the caller paused and went on (a reply takes longer), so "... is four one one" then
# "eight two seven" reads as six digits of a number, not as a complete turn of three
TABLE_WORDS = 16  # of those words at most: the table reads 3 tokens, a digit run of up to 12 words as one
SHIPPED_WEIGHTS = weights.WEIGHTS_DIR / "stt.safetensors"
CANDIDATES_PER_FRAME = 8  # tokens per frame the beam search considers (of 29)
SHIPPED = "shipped"  # lm= default: the shipped language model (engine/weights/lm.arpa.gz)
LmChoice = Union[NgramLm, None, str]
TurnsChoice = Union[TurnCompletion, None, str]
PRECISIONS = ("auto", "float", "int8")  # how streams step the model: see resolve_precision()


def resolve_lm(lm: LmChoice) -> Optional[NgramLm]:
    """An lm= argument -> the model to decode with: SHIPPED loads the shipped one (None when
    the file is absent: greedy decoding), None means greedy, a path string loads that ARPA file."""
    return _resolve(lm, SHIPPED_LM, load_lm)


def resolve_turns(turns: TurnsChoice) -> Optional[TurnCompletion]:
    """A turns= argument -> the turn-completion table: SHIPPED (None when the file is absent),
    None (the acoustic end-of-turn head decides alone), or a path string to load."""
    return _resolve(turns, SHIPPED_TURNS, load_turns)


def _resolve(choice, shipped: Path, load):
    if isinstance(choice, str):
        if choice == SHIPPED:
            return load(shipped) if shipped.exists() else None
        return load(Path(choice))
    return choice


@dataclass
class SttConfig:
    width: int = 256
    depth: int = 6
    expand: int = 1
    mlp_ratio: int = 2
    vocab_size: int = len(VOCAB)


class SttModel(nn.Module):
    def __init__(self, config: SttConfig) -> None:
        super().__init__()
        self.config = config
        self.input = nn.Linear(FRAMES_PER_STEP * N_MELS, config.width)
        self.core = RecurrentStack(config.width, config.depth, config.expand, config.mlp_ratio)
        self.ctc_head = nn.Linear(config.width, config.vocab_size)
        self.eot_head = nn.Linear(config.width, 3)

    def initial_state(self, batch: int, device=None) -> list[BlockState]:
        return self.core.initial_state(batch, device)

    def encode(self, stacked: Tensor, state: Optional[list[BlockState]] = None):
        """stacked mels [B, T, 4 * N_MELS] -> (the encoder's output [B, T, width], state): what both heads read."""
        return self.core(F.gelu(self.input(stacked)), state)

    def forward(self, stacked: Tensor, state: Optional[list[BlockState]] = None):
        """stacked mels [B, T, 4 * N_MELS] -> (ctc logits [B, T, V], eot logits [B, T, 3], state)."""
        hidden, state = self.encode(stacked, state)
        return self.ctc_head(hidden), self.eot_head(hidden), state

    def step(self, stacked: Tensor, state: list[BlockState]):
        """One 40 ms frame [B, 4 * N_MELS] -> (ctc logits [B, V], eot logits [B, 3], state)."""
        hidden, state = self.core.step(F.gelu(self.input(stacked)), state)
        return self.ctc_head(hidden), self.eot_head(hidden), state

    def config_dict(self) -> dict:
        return asdict(self.config)


class FrozenSttModel:
    """SttModel.step with int8 matrices and fused projections (engine/inference.py), same state.

    5-7x faster than the float model for one stream on an AVX2 CPU with Parley's kernel
    (bench/stt_step.py); held-out WER with the LM as with torch's int8 kernel, within 0.005 per
    folder (MODEL_CARD.md, "CPU inference")."""

    def __init__(self, model: SttModel, int8: bool = True, kernel: Optional[str] = None) -> None:
        """kernel: which multiplies the int8 matrices (engine.inference.INT8_KERNELS; default
        Parley's own where it is available, see engine/cpu_kernels.py)."""
        self.config, self.gelu = model.config, gelu_for(int8)
        self.kernel = check_int8_kernel(kernel) if int8 else None  # None: fp32 matrices
        self.input = PackedLinear.concat([model.input], int8, kernel=kernel)
        self.core = FrozenStack(model.core, int8, kernel)
        self.heads = PackedLinear.concat([model.ctc_head, model.eot_head], int8, self.core.final_gain, kernel)

    def initial_state(self, batch: int, device=None) -> list[BlockState]:
        return self.core.initial_state(batch, device)

    def step(self, stacked: Tensor, state: list[BlockState]):
        """One 40 ms frame [B, 4 * N_MELS] -> (ctc logits [B, V], eot logits [B, 3], state)."""
        hidden, state, norm_gain = self.core.step(self.gelu(self.input(stacked.float())), state)
        logits = self.heads(hidden, norm_gain)
        return logits[:, :self.config.vocab_size], logits[:, self.config.vocab_size:], state


def resolve_precision(model: SttModel, precision: str = "auto") -> str:
    """"float" or "int8": "auto" is int8 when the model is fp32 on a CPU and torch has the kernel."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    parameter = next(model.parameters())
    on_cpu = parameter.device.type == "cpu"
    if precision == "auto":
        return "int8" if on_cpu and parameter.dtype == torch.float32 and int8_supported() else "float"
    if precision == "int8" and not on_cpu:
        raise ValueError(f"int8 streaming runs on the CPU, and this model is on {parameter.device}")
    return precision


def streaming_model(model: SttModel, precision: str = "auto") -> Union[SttModel, FrozenSttModel]:
    """What steps a stream: for "float" the model itself (the reference: any device, any dtype),
    for "int8" its frozen form (CPU; see resolve_precision), kept per model (cached_freeze)."""
    if resolve_precision(model, precision) == "float":
        return model.eval()
    return cached_freeze(model, "int8", lambda m: FrozenSttModel(m.eval()))


def encode_text(text: str) -> list[int]:
    """Normalised text (lowercase letters, apostrophes, spaces) -> token ids; others dropped."""
    return [CHAR_TO_ID[c] for c in text if c in CHAR_TO_ID and c != VOCAB[BLANK]]


# -- decoding -------------------------------------------------------------------------------

@dataclass
class _Emission:
    char: str
    frame: int


@dataclass
class GreedyCtc:
    """Greedy CTC over a stream of frames, remembering where each character was emitted."""

    emissions: list[_Emission] = field(default_factory=list)
    previous: int = BLANK

    def push(self, token: int, frame: int) -> bool:
        """Add one frame's best token; True when the text grew."""
        grew = token != BLANK and token != self.previous
        if grew:
            self.emissions.append(_Emission(VOCAB[token], frame))
        self.previous = token
        return grew

    def text(self) -> str:
        return " ".join("".join(e.char for e in self.emissions).split())

    def words(self) -> list[tuple[str, float, float]]:
        """(word, start s, end s) from the frames where its first and last characters appeared."""
        words, current = [], []
        for emission in self.emissions + [_Emission(" ", -1)]:
            if emission.char == " ":
                if current:
                    word = "".join(e.char for e in current)
                    words.append((word, current[0].frame * FRAME_S, (current[-1].frame + 1) * FRAME_S))
                current = []
            else:
                current.append(emission)
        return words

    def reset(self) -> None:
        self.emissions.clear()
        self.previous = BLANK


FrameOutput = tuple[int, list[float], list[tuple[int, float]]]


def frame_candidates(ctc_logits: Tensor) -> list[list[tuple[int, float]]]:
    """CTC logits [T, V] -> per frame the CANDIDATES_PER_FRAME likeliest tokens as
    (token, log probability), best first: what the beam search reads."""
    log_probs, tokens = torch.log_softmax(ctc_logits.float(), -1).topk(CANDIDATES_PER_FRAME, dim=-1)
    return [list(zip(t, lp)) for t, lp in zip(tokens.tolist(), log_probs.tolist())]


def frame_outputs(ctc_logits: Tensor, eot_logits: Tensor) -> list[FrameOutput]:
    """A batch of frame logits [B, V], [B, 3] -> per row (best token, end-of-turn probabilities,
    frame_candidates)."""
    probabilities = torch.softmax(eot_logits.float(), -1).tolist()
    return [(c[0][0], p, c) for c, p in zip(frame_candidates(ctc_logits), probabilities)]


def combined_end_probability(acoustic: float, text_log_odds: float, weight: float = TURN_TEXT_WEIGHT,
                             clip: float = TURN_TEXT_CLIP) -> float:
    """P(end) from the head's P(end) and the turn table's log odds, as independent evidence:
    sigmoid(logit(head) + weight * clip(table log odds, +-clip))."""
    text = min(max(text_log_odds, -clip), clip)
    return 1.0 / (1.0 + math.exp(-(_log_odds(acoustic) + weight * text)))


def default_turn_end_probability(turns: Optional[TurnCompletion]) -> float:
    """The P(end) that closes a turn unless a caller chooses one: with or without the table."""
    return END_OF_TURN_THRESHOLD if turns is None else TURN_END_PROBABILITY


def check_turn_end_probability(p: float) -> float:
    """A turn-end threshold must be a probability strictly between 0 and 1."""
    if not 0.0 < float(p) < 1.0:
        raise ValueError(f"turn_end_probability must be between 0 and 1 (exclusive), not {p!r}")
    return float(p)


class StreamDecoder:
    """One stream's decoding: per-frame (best token, end-of-turn probabilities) -> engine events.

    Shared by the single-stream Recognizer and the batched runtime, so both emit the same events.
    """

    def __init__(self, lm: Optional[NgramLm] = None, turns: Optional[TurnCompletion] = None,
                 turn_end_probability: Optional[float] = None) -> None:
        """turn_end_probability: P(end) that closes a turn (default TURN_END_PROBABILITY with the
        table, END_OF_TURN_THRESHOLD without): lower ends turns sooner and cuts more callers off
        at a pause (see check_turn_end_probability)."""
        self.frame = 0
        self.ctc = GreedyCtc()
        self.beam = CtcBeamSearch(lm, VOCAB, BLANK) if lm is not None else None
        self.turns = turns
        self.turn_end_probability = check_turn_end_probability(
            turn_end_probability if turn_end_probability is not None else default_turn_end_probability(turns))
        self._last_partial = ""
        self._last_partial_frame = -PARTIAL_EVERY_FRAMES
        self._speech_frames = 0
        self._quiet_frames = 0
        self._in_speech = False
        self._likely = False  # SpeechLikely sent for the sound under way
        self._ended_words: list[str] = []  # the last turn's words and the frame its end was claimed,
        self._ended_frame = -CONTINUATION_FRAMES  # for speech that resumes soon after (CONTINUATION_FRAMES)
        self._resumed_words: list[str] = []  # what this turn continues, for the turn table
        # Where the turn table reads the turn's words instead of this decoder's own (a better
        # recognizer's latest reading of the turn: engine/whisper_stream.py TurnReader.words_for_table)
        self.words_source: Optional[Callable[[], Sequence[str]]] = None

    def on_frame(self, token: int, eot: Sequence[float], candidates: Sequence[tuple[int, float]] = ()) -> list[SttEvent]:
        """One frame: its best token, end-of-turn probabilities and (for the beam search) the
        likeliest tokens with their log probabilities."""
        events: list[SttEvent] = []
        grew = self.ctc.push(token, self.frame)
        if self.beam is not None and candidates:
            self.beam.push(candidates, self.frame)
        speaking = token != BLANK or max(range(len(eot)), key=eot.__getitem__) == SPEECH
        self._speech_frames = self._speech_frames + 1 if speaking else 0
        self._quiet_frames = 0 if speaking else self._quiet_frames + 1
        text = self.ctc.text()
        heard = eot[SPEECH] >= SPEECH_PROBABILITY
        if not self._in_speech and (heard or (self._speech_frames >= SPEECH_START_FRAMES and text)):
            self._in_speech = self._likely = True
            started = self.frame - max(self._speech_frames, 1) + 1
            self._resumed_words = self._ended_words if started - self._ended_frame <= CONTINUATION_FRAMES else []
            events.append(SpeechStart(t=started * FRAME_S))
        elif eot[SPEECH] < LIKELY_RESET_PROBABILITY and token == BLANK:
            self._likely = False
        elif not self._in_speech and not self._likely and (eot[SPEECH] >= LIKELY_PROBABILITY or token != BLANK):
            self._likely = True  # (once per sound: until the head falls back below the reset level)
            events.append(SpeechLikely(t=self.frame * FRAME_S, probability=float(eot[SPEECH])))
        if text and (grew or self.beam is not None) and self.frame - self._last_partial_frame >= PARTIAL_EVERY_FRAMES:
            # The turn's first partial goes out on its first character: a barge-in pauses on it.
            shown = self._partial_text(text)
            if shown != self._last_partial:
                self._last_partial, self._last_partial_frame = shown, self.frame
                events.append(Partial(shown))
        end = self._end_probability(eot[END_OF_TURN], text) if self._in_speech and text else None
        if end is not None and (end >= self.turn_end_probability or self._quiet_frames >= SILENT_TURN_END_FRAMES):
            final = self._final()
            events += [final, EndOfTurn(confidence=end)]
            self._close_turn()
            self._ended_words = (self._resumed_words + final.text.split())[-TABLE_WORDS:]
            self._ended_frame = self.frame
        elif self._in_speech and not text and self._quiet_frames >= WORDLESS_END_FRAMES:
            events.append(EndOfTurn(confidence=0.0))  # a cough, a click: over, and nothing was said
            self._close_turn()
        self.frame += 1
        return events

    def _end_probability(self, acoustic: float, greedy: str) -> float:
        """P(the turn is over) now: the end-of-turn head's, or with the turn-completion table
        the two combined as independent evidence (sum of log odds)."""
        if self.turns is None:
            return float(acoustic)
        if self._quiet_frames < TURN_END_QUIET_FRAMES:
            return 0.0
        return combined_end_probability(acoustic, self.text_log_odds(greedy))

    def text_log_odds(self, greedy: str) -> float:
        """The turn table's log odds that the words so far finish a turn (needs a table), after
        the words of a turn that ended just before this one began (CONTINUATION_FRAMES)."""
        if self.words_source is not None:
            return _log_odds(self.turns.probability(list(self.words_source())))
        # With the beam, the latest partial (its best, refreshed every other frame) spares a ranking.
        words = (greedy if self.beam is None else self._last_partial or greedy).split()
        return _log_odds(self.turns.probability(self._resumed_words + words))

    def flush(self) -> list[SttEvent]:
        """The audio ended: finalise whatever was heard (no end-of-turn claim)."""
        events: list[SttEvent] = [self._final()] if self.ctc.text() else []
        self._close_turn()
        self._ended_words = []
        return events

    def _partial_text(self, greedy: str) -> str:
        """What the caller has said so far: the beam's best (so a partial that stays put is
        what the final will say, and a responder started on it early is not wasted), or
        the greedy text while the beam has no word yet."""
        words = self.beam.best()[0] if self.beam is not None else []
        return " ".join(words) if words else greedy

    def _final(self) -> Final:
        """The turn's transcript: the beam's best with the language model, else greedy."""
        words, spans = self.beam.best() if self.beam is not None else ([], [])
        if not words:
            return Final(self.ctc.text(), self.ctc.words())
        return Final(" ".join(words), [(w, first * FRAME_S, (last + 1) * FRAME_S) for w, (first, last) in zip(words, spans)])

    def _close_turn(self) -> None:
        self.ctc.reset()
        if self.beam is not None:
            self.beam.reset()
        self._last_partial = ""
        self._in_speech = False
        self._speech_frames = self._quiet_frames = 0


def _log_odds(p: float) -> float:
    p = min(max(float(p), 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


class Recognizer:
    """One caller's streaming recognition: audio in, engine events out (single-stream path).

    The batched runtime (engine/runtime/) drives many streams through SttModel.step at
    once with the same StreamDecoder; this class is the reference behaviour for one stream,
    and what tests and the bench CLI use. precision: see streaming_model() ("float" steps
    exactly as `forward` computes; the CPU default steps with int8 matrices, 3x faster).
    """

    def __init__(self, model: SttModel, lm: LmChoice = SHIPPED, turns: TurnsChoice = SHIPPED,
                 precision: str = "auto", turn_end_probability: Optional[float] = None) -> None:
        self.model = streaming_model(model, precision)
        self.features = StreamingLogMel()
        self.stacker = FrameStacker()
        self.state = model.initial_state(1)
        self.decoder = StreamDecoder(resolve_lm(lm), resolve_turns(turns), turn_end_probability)

    @torch.inference_mode()
    def push(self, pcm: np.ndarray) -> list[SttEvent]:
        """int16 (or float in [-1, 1]) 16 kHz mono -> events caused by this audio."""
        stacked = self.stacker.push(self.features.push(to_finite_float(pcm)))
        events: list[SttEvent] = []
        for frame in stacked:
            ctc_logits, eot_logits, self.state = self.model.step(frame[None], self.state)
            events += self.decoder.on_frame(*frame_outputs(ctc_logits, eot_logits)[0])
        return events

    def flush(self) -> list[SttEvent]:
        """The audio ended: finalise whatever was heard (no end-of-turn claim)."""
        return self.decoder.flush()


@torch.inference_mode()
def offline_ctc_logits(model: SttModel, audio: np.ndarray) -> Tensor:
    """One utterance (float or int16, 16 kHz) through the model in one parallel pass -> CTC
    logits [T, V] (T = 0 for audio shorter than a frame)."""
    from .audio import log_mel, stack_frames

    stacked = stack_frames(log_mel(torch.from_numpy(to_float(audio)))).unsqueeze(0)
    if stacked.shape[1] == 0:
        return torch.zeros(0, len(VOCAB))
    return model.eval()(stacked)[0][0]


@torch.inference_mode()
def transcribe(model: SttModel, audio: np.ndarray, lm: LmChoice = SHIPPED) -> str:
    """Offline transcription of one utterance (float or int16, 16 kHz): the beam search with
    the language model, or greedy CTC when lm is None (training selects checkpoints so)."""
    return decode_offline(offline_ctc_logits(model, audio), lm)


def decode_offline(ctc_logits: Tensor, lm: LmChoice = SHIPPED) -> str:
    """The text of one utterance's CTC logits: beam search with the LM, or greedy without one."""
    if ctc_logits.shape[0] == 0:
        return ""
    language_model = resolve_lm(lm)
    if language_model is None:
        decoder = GreedyCtc()
        for frame, token in enumerate(ctc_logits.argmax(-1).tolist()):
            decoder.push(token, frame)
        return decoder.text()
    beam = CtcBeamSearch(language_model, VOCAB, BLANK)
    for frame, candidates in enumerate(frame_candidates(ctc_logits)):
        beam.push(candidates, frame)
    return " ".join(beam.best()[0])


def load_model(path: Optional[Path] = None, device: str = "cpu") -> SttModel:
    """The shipped STT weights, or a .safetensors / training checkpoint (.pt) given by path.

    Raises FileNotFoundError naming the path when there are no weights (not trained yet).
    """
    return weights.load_model(SttModel, SttConfig, Path(path) if path else SHIPPED_WEIGHTS, device)
