"""Streaming text-to-speech: an SSM phoneme encoder with bounded lookahead predicts, id by id,
what Piper joe's text encoder would (its prior mean and duration); Piper's own flow and
HiFi-GAN decoder (engine/piper.py) turn those into 22.05 kHz speech, chunk by chunk.

    text deltas ─► IncrementalText (engine/text.py) ─► phoneme ids (Piper's espeak-ng)
      ─► embed ─► causal RecurrentStack over ids; id i reads the state at i + LOOKAHEAD
      ─► duration head (frames per id) and prior head (Piper's m_p, 192 values per id)
      ─► each id's prior repeated for its frames (11.6 ms) ─► FrameBuffer
      ─► chunks of frames with CONTEXT_FRAMES either side ─► Piper flow + decoder ─► audio

Piper's encoder attends over a whole sentence, so Piper speaks a sentence at a time; this
encoder is causal with a few ids of lookahead, so speech starts on the first stable phrase.
Only the encoder is Parley's (distilled from Piper on CPU, engine/train/train_tts.py); the
acoustics are the pretrained voice's. A stream's bookkeeping (`Schedule`) is kept apart from
its model state, and `encode_ids` / `render` work on explicit state and any batch, so the
batched runtime (engine/runtime/tts_stream.py, TtsStepper) renders every stream's chunk in one call.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from . import piper, weights
from .inference import FrozenStack, PackedLinear, cached_freeze
from .interface import Audio, TtsEvent, WordMark
from .ssm import BlockState, RecurrentStack
from .text import N_PHONEME_IDS, IncrementalText, Phrase

SAMPLE_RATE = piper.SAMPLE_RATE  # the voice's 22.05 kHz; resampling for Opus or 16 kHz is at the edge
HOP = piper.HOP  # samples per frame
PRIOR_CHANNELS = piper.PRIOR_CHANNELS
CONTEXT_FRAMES = piper.CONTEXT_FRAMES
END_ID = N_PHONEME_IDS - 1  # fed LOOKAHEAD times after the last id: "no more text"
MAX_FRAMES_PER_ID = 60  # 0.7 s: a cap on any predicted duration
FIRST_CHUNK_FRAMES = 8  # the first chunk is short (93 ms of audio): time to first audio ...
CHUNK_FRAMES = 64  # ... then chunks double up to this (743 ms): each chunk renders 2 x CONTEXT_FRAMES
# more than it keeps, so long chunks waste less. cancel() acts at a chunk boundary.
FIRST_ENCODE_IDS = 24  # a reply's first encoder call takes only this many ids (~9 phonemes with their
# pads, ~60 frames: the first chunk and its right context): an encoder call costs about its
# length (6 ms for 24 ids, 14 ms for a 150-id sentence), and the rest can wait for the next.
SHIPPED_WEIGHTS = weights.WEIGHTS_DIR / "tts.safetensors"


@dataclass
class TtsConfig:
    width: int = 192
    encoder_depth: int = 3
    mlp_ratio: int = 2
    lookahead: int = 6  # ids (PAD between phonemes, so ~3 phonemes)


class TtsModel(nn.Module):
    def __init__(self, config: TtsConfig) -> None:
        super().__init__()
        self.config = config
        w = config.width
        self.embed = nn.Embedding(N_PHONEME_IDS, w)
        self.encoder = RecurrentStack(w, config.encoder_depth, 1, config.mlp_ratio)
        self.phoneme_out = nn.Linear(2 * w, w)
        self.duration_head = nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Linear(w, 1))
        self.prior_head = nn.Sequential(nn.Linear(w, 2 * w), nn.GELU(), nn.Linear(2 * w, PRIOR_CHANNELS))
        nn.init.constant_(self.duration_head[-1].bias, math.log1p(2.0))  # ~2 frames per id to start
        # target normalisation, set from the training data (ships inside the weights file)
        self.register_buffer("prior_mean", torch.zeros(PRIOR_CHANNELS))
        self.register_buffer("prior_std", torch.ones(PRIOR_CHANNELS))

    def config_dict(self) -> dict:
        return asdict(self.config)

    def encode(self, ids: Tensor, state: list[BlockState], history: Tensor) -> tuple[Tensor, list[BlockState], Tensor]:
        """ids [B, L] (appended to a stream) -> (vectors [B, L, width] for the ids LOOKAHEAD
        positions earlier, new encoder state, new history of the last LOOKAHEAD embeddings).

        Before LOOKAHEAD ids have been seen the first outputs belong to no id; the caller
        drops them (Schedule counts ids)."""
        embedded = self.embed(ids)
        hidden, state = self.encoder(embedded, state)
        past = torch.cat([history, embedded], dim=1)  # [B, k + L, w]: embedding of id i - k
        vectors = self.phoneme_out(torch.cat([hidden, past[:, : ids.shape[1]]], dim=-1))
        return vectors, state, past[:, -self.config.lookahead:]

    def initial_history(self, batch: int, device=None) -> Tensor:
        return torch.zeros(batch, self.config.lookahead, self.config.width, device=device)

    def durations(self, vectors: Tensor) -> Tensor:
        """Predicted log(1 + frames) per id [B, L]."""
        return self.duration_head(vectors).squeeze(-1)

    def normalised_prior(self, vectors: Tensor) -> Tensor:
        return self.prior_head(vectors)

    def prior(self, vectors: Tensor) -> Tensor:
        """Piper's prior mean per id [B, L, 192], as the flow consumes it."""
        return self.prior_head(vectors) * self.prior_std + self.prior_mean

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Training: ids [B, L] (padded with END_ID) -> (log-duration predictions [B, L],
        normalised prior predictions [B, L, 192])."""
        batch = ids.shape[0]
        k = self.config.lookahead
        padded = torch.cat([ids, torch.full((batch, k), END_ID, dtype=ids.dtype, device=ids.device)], dim=1)
        vectors, _, _ = self.encode(padded, self.encoder.initial_state(batch, ids.device),
                                    self.initial_history(batch, ids.device))
        vectors = vectors[:, k:]
        return self.durations(vectors), self.normalised_prior(vectors)


def round_durations(log_durations: Tensor) -> Tensor:
    return torch.clamp(torch.round(torch.expm1(log_durations.float().clamp(max=8.0))), 0, MAX_FRAMES_PER_ID).long()


# -- one utterance's bookkeeping (model-free) -------------------------------------------------

@dataclass
class Chunk:
    """Frames to render: `window` [192, W] holds them with up to CONTEXT_FRAMES of prior on
    each side; the chunk's own frames are window[:, offset:offset + frames]."""

    window: np.ndarray
    offset: int
    frames: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.window.shape[1], self.offset, self.frames


class Schedule:
    """What one utterance has queued, without model state: text -> ids to encode, encoded ids
    -> prior frames (FrameBuffer), and the word marks at their first frame.

    A chunk is rendered only once CONTEXT_FRAMES more frames are known after it (or the text
    has ended), so it sounds as it would inside the whole utterance. The single-stream
    Synthesizer and the runtime's batched TtsStepper both keep their model state elsewhere
    and share this.
    """

    def __init__(self, lookahead: int) -> None:
        self.lookahead = lookahead
        self.text = IncrementalText()
        self.unencoded: deque[tuple[int, Optional[str]]] = deque()  # (id, its word start) not yet encoded
        self.ids_seen = 0  # ids fed to the encoder (including END_ID padding)
        self.words: deque[Optional[str]] = deque()  # per fed id, its word start (or None)
        self.text_ended = False
        self.frames = np.zeros((PRIOR_CHANNELS, 0), np.float32)  # prior frames from frame `base` on
        self.base = 0
        self.known = 0  # frames known so far
        self.rendered = 0  # frames handed out to render
        self.marks: deque[tuple[int, str]] = deque()  # (first frame, word) not yet handed out
        self.word_marks: list[WordMark] = []

    @property
    def ended(self) -> bool:
        """The text has ended and every id of it is encoded: no frame waits for more context."""
        return self.text_ended and not self.unencoded

    @property
    def done(self) -> bool:
        return self.ended and self.rendered == self.known and not self.marks

    def push_text(self, delta: str) -> None:
        """Text delta -> the ids of its stable phrases, queued for the encoder (take_unencoded)."""
        self.unencoded.extend(zip(*self._ids(self.text.push(delta))))

    def end(self) -> None:
        """No more text -> the last ids queued, then LOOKAHEAD END_IDs ("no more text")."""
        ids, labels = self._ids(self.text.end())
        self.text_ended = True
        self.unencoded.extend(zip(ids + [END_ID] * self.lookahead, labels + [None] * self.lookahead))

    def take_unencoded(self, limit: Optional[int] = None) -> tuple[list[int], list[Optional[str]]]:
        """Up to `limit` (default all) queued ids for the encoder, and their word labels."""
        taken = [self.unencoded.popleft() for _ in range(min(len(self.unencoded), limit or len(self.unencoded)))]
        return [i for i, _ in taken], [label for _, label in taken]

    def encode_limit(self) -> Optional[int]:
        """How many ids the next encoder call should take: FIRST_ENCODE_IDS while no frame has
        been rendered (time to first audio), else all that are queued."""
        return FIRST_ENCODE_IDS if self.rendered == 0 else None

    @staticmethod
    def _ids(phrases: list[Phrase]) -> tuple[list[int], list[Optional[str]]]:
        ids: list[int] = []
        labels: list[Optional[str]] = []
        for phrase in phrases:
            phrase_labels: list[Optional[str]] = [None] * len(phrase.ids)
            for i, word in zip(phrase.word_starts, phrase.words):  # merged words share an id
                phrase_labels[i] = word if phrase_labels[i] is None else f"{phrase_labels[i]} {word}"
            ids += phrase.ids
            labels += phrase_labels
        return ids, labels

    def encoded(self, labels: list[Optional[str]]) -> list[int]:
        """Note ids just fed to the encoder -> indices (into them) of the encoder outputs that
        now belong to an id: output j belongs to the id LOOKAHEAD positions earlier."""
        first = self.ids_seen
        self.ids_seen += len(labels)
        self.words.extend(labels)
        return [j for j in range(len(labels)) if first + j - self.lookahead >= 0]

    def add_ready(self, priors: np.ndarray, frames: list[int]) -> None:
        """Encoded ids: their priors [n, 192] and frames per id."""
        for prior, n in zip(priors, frames):
            word = self.words.popleft()
            if word:
                self.marks.extend((self.known, w) for w in word.split(" "))
            if n:
                self.frames = np.concatenate([self.frames, np.repeat(prior[:, None], n, axis=1)], axis=1)
                self.known += n

    def frames_ready(self) -> int:
        """Frames that could be rendered now (those still waiting for their right context excluded)."""
        return max(0, self.known - self.rendered - (0 if self.ended else CONTEXT_FRAMES))

    def take(self, limit: int) -> tuple[Optional[Chunk], list[WordMark]]:
        """Up to `limit` ready frames -> (their Chunk, or None when none is ready; the word
        marks that start inside it, with their sample offsets in the utterance)."""
        count = min(limit, self.frames_ready())
        end = self.rendered + count
        marks = []
        while self.marks and (self.marks[0][0] < end or (self.ended and end == self.known)):
            frame, word = self.marks.popleft()
            marks.append(WordMark(word, frame * HOP))
        self.word_marks += marks
        if count == 0:
            return None, marks
        lo, hi = max(0, self.rendered - CONTEXT_FRAMES), min(self.known, end + CONTEXT_FRAMES)
        chunk = Chunk(self.frames[:, lo - self.base:hi - self.base], self.rendered - lo, count)
        self.rendered = end
        keep_from = max(0, end - CONTEXT_FRAMES)  # the next chunk's left context onwards
        self.frames, self.base = self.frames[:, keep_from - self.base:], keep_from
        return chunk, marks

    def clear(self) -> None:
        self.frames, self.base = self.frames[:, :0], self.known
        self.rendered = self.known
        self.marks.clear()
        self.unencoded.clear()
        self.text_ended = True


@torch.inference_mode()
def encode_ids(model: TtsModel, schedule: Schedule, ids: list[int], labels: list[Optional[str]],
               encoder_state: list[BlockState], history: Tensor) -> tuple[list[BlockState], Tensor]:
    """Feed one stream's new ids (batch of one) to the encoder; ids whose lookahead is now
    known get their durations and priors and join the schedule's frames. Returns the new state."""
    if not ids:
        return encoder_state, history
    tensor = torch.tensor([ids], dtype=torch.long, device=history.device)
    vectors, encoder_state, history = inference_model(model).encode(tensor, encoder_state, history)
    own = schedule.encoded(labels)
    if own:
        chosen = vectors[0, own]
        schedule.add_ready(model.prior(chosen).float().cpu().numpy(),
                           round_durations(model.durations(chosen)).tolist())
    return encoder_state, history


class FrozenTts:
    """TtsModel.encode for a CPU in fp32: the SSM stack frozen with fused projections and its
    RMSNorm gain folded (engine/inference.py, FrozenStack.scan), the same outputs within float
    rounding. Encoder calls are a phrase long, where op count, not arithmetic, sets the time."""

    def __init__(self, model: TtsModel) -> None:
        self.lookahead = model.config.lookahead
        self.embedding = model.embed.weight.detach().float()
        self.encoder = FrozenStack(model.encoder, int8=False)
        # phoneme_out reads [encoder output after its final RMSNorm, an embedding]: the norm's
        # weight folds into the first half of its columns
        width = model.config.width
        self.phoneme_out = PackedLinear.concat([model.phoneme_out], False,
                                               torch.cat([self.encoder.final_gain, torch.ones(width)]))

    def encode(self, ids: Tensor, state: list[BlockState], history: Tensor) -> tuple[Tensor, list[BlockState], Tensor]:
        batch, length = ids.shape
        embedded = self.embedding[ids]
        hidden, state, norm_gain = self.encoder.scan(embedded, state)
        past = torch.cat([history, embedded], dim=1)
        vectors = self.phoneme_out(torch.cat([hidden * norm_gain, past[:, :length]], dim=-1).reshape(batch * length, -1))
        return vectors.view(batch, length, -1), state, past[:, -self.lookahead:]


def inference_model(model: TtsModel) -> Union[TtsModel, FrozenTts]:
    """What encodes streams: the frozen form of an fp32 model on a CPU, else the model itself."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return model
    return cached_freeze(model, "tts", FrozenTts)


def render(chunks: list[Chunk], threads: int = 1) -> list[np.ndarray]:
    """Chunks of any streams, all of one shape, through Piper's flow and decoder in one call ->
    each chunk's float audio [frames * HOP]."""
    windows = np.stack([chunk.window for chunk in chunks])
    return list(piper.frame_renderer(threads)(windows, chunks[0].offset, chunks[0].frames))


# -- one stream --------------------------------------------------------------------------------

class Synthesizer:
    """One stream: text deltas in, Audio and WordMark events out, chunk by chunk.

    push_text/end release phrases (engine/text.py); `pull()` renders the next chunk of ready
    frames (up to CHUNK_FRAMES, doubling from FIRST_CHUNK_FRAMES) and returns the events.
    Fixed-size model state: the encoder's SSM state and lookahead history, plus the Schedule's
    frames (bounded by the pending text). The gateway's streams run on the batched runtime
    (engine/runtime/) instead; this is the reference it is tested against, and what offline
    synthesis and the benchmarks use.
    """

    def __init__(self, model: TtsModel, device: str = "cpu") -> None:
        self.model = model.eval()
        self.schedule = Schedule(model.config.lookahead)
        self.encoder_state = model.encoder.initial_state(1, device)
        self.history = model.initial_history(1, device)
        self.chunk_frames = FIRST_CHUNK_FRAMES
        self.cancelled = False

    @property
    def word_marks(self) -> list[WordMark]:
        return self.schedule.word_marks

    @property
    def done(self) -> bool:
        return self.cancelled or self.schedule.done

    def push_text(self, delta: str) -> None:
        if not self.cancelled:
            self.schedule.push_text(delta)

    def end(self) -> None:
        if not (self.cancelled or self.schedule.text_ended):
            self.schedule.end()

    def cancel(self) -> None:
        self.cancelled = True
        self.schedule.clear()

    def _encode(self, frames: int) -> None:
        """Queued ids through the encoder until `frames` are ready to render (or none is queued)."""
        while self.schedule.unencoded and self.schedule.frames_ready() < frames:
            ids, labels = self.schedule.take_unencoded(self.schedule.encode_limit())
            self.encoder_state, self.history = encode_ids(self.model, self.schedule, ids, labels,
                                                          self.encoder_state, self.history)

    def pull(self) -> list[TtsEvent]:
        """Encode what the next chunk needs and render it -> events ([] when nothing is ready)."""
        if self.cancelled:
            return []
        self._encode(self.chunk_frames)
        chunk, marks = self.schedule.take(self.chunk_frames)
        if chunk is None:
            return list(marks)
        self.chunk_frames = min(CHUNK_FRAMES, 2 * self.chunk_frames)
        audio = render([chunk])[0]
        return [*marks, Audio(to_int16(audio), SAMPLE_RATE)]

    def events(self) -> Iterator[TtsEvent]:
        """Everything ready now, chunk by chunk."""
        while True:
            chunk = self.pull()
            if not chunk:
                return
            yield from chunk


def to_int16(audio: np.ndarray) -> np.ndarray:
    return np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16)


def synthesize_offline(model: TtsModel, text: str) -> tuple[np.ndarray, list[WordMark]]:
    """Whole text at once through the same Synthesizer -> (int16 audio, word marks)."""
    synth = Synthesizer(model)
    synth.push_text(text)
    synth.end()
    pieces = [e.pcm for e in synth.events() if isinstance(e, Audio)]
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    return audio, synth.word_marks


@torch.inference_mode()
def utterance_prior(model: TtsModel, ids: list[int]) -> np.ndarray:
    """The fully parallel path (training-style forward): the whole utterance's repeated prior [192, T]."""
    k = model.config.lookahead
    tensor = torch.tensor([ids + [END_ID] * k])
    vectors, _, _ = model.encode(tensor, model.encoder.initial_state(1), model.initial_history(1))
    vectors = vectors[0, k:]
    durations = round_durations(model.durations(vectors)).numpy()
    return np.repeat(model.prior(vectors).numpy().T, durations, axis=1)


def synthesize_whole(model: TtsModel, ids: list[int]) -> np.ndarray:
    """The whole utterance through the flow and decoder in one call: float audio. What the
    chunked stream is checked against (its seams), and fast evaluation."""
    prior = utterance_prior(model, ids)
    if prior.shape[1] == 0:
        return np.zeros(0, np.float32)
    return piper.frame_renderer()(prior[None])[0]


def load_model(path: Optional[Path] = None, device: str = "cpu") -> TtsModel:
    """The shipped TTS weights, or a .safetensors / training checkpoint (.pt) by path."""
    return weights.load_model(TtsModel, TtsConfig, Path(path) if path else SHIPPED_WEIGHTS, device)
