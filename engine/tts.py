"""Streaming text-to-speech: SSM phoneme encoder with bounded lookahead, durations, SSM frame
decoder, source-filter vocoder (engine/vocoder.py). Distilled from Piper en_US-joe-medium.

    text deltas ─► IncrementalText (engine/text.py) ─► phoneme ids (Piper's espeak-ng)
      ─► embed ─► causal RecurrentStack over ids; phoneme i reads the state at i + LOOKAHEAD
      ─► duration head (frames per id, trained on Piper's exact alignments)
      ─► repeat each id's vector for its frames (+ position within the id)
      ─► causal RecurrentStack over 11.6 ms frames ─► vocoder features ─► 22.05 kHz audio

Every stage is causal and carries a fixed-size state, so `Synthesizer` (one stream) renders
audio chunk by chunk as phrases arrive, with the same numbers as `synthesize_offline`. A
stream's bookkeeping (`Schedule`) is kept apart from its model state, and `encode_ids` /
`render` take explicit state for any batch, so the batched runtime (engine/runtime.py,
TtsStepper) renders every stream's frames in one step per tick with the same code.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from . import vocoder, weights
from .interface import Audio, TtsEvent, WordMark
from .inference import FrozenStack, PackedLinear, cached_freeze
from .ssm import BlockState, RecurrentStack
from .text import N_PHONEME_IDS, IncrementalText, Phrase

SAMPLE_RATE = vocoder.SAMPLE_RATE  # output: the teacher's 22.05 kHz (no content above 11 kHz to learn)
HOP = vocoder.HOP  # samples per model frame
END_ID = N_PHONEME_IDS - 1  # fed LOOKAHEAD times after the last id: "no more text"
MAX_FRAMES_PER_ID = 60  # 0.7 s: a cap on any predicted duration
FIRST_CHUNK_FRAMES = 4  # the first chunk is short (46 ms of audio): time to first audio ...
CHUNK_FRAMES = 32  # ... then chunks double up to this (372 ms): fewer, larger ops per second of
# audio on CPU (per-op overhead dominates at this model size). cancel() acts at a chunk boundary.
SHIPPED_WEIGHTS = weights.WEIGHTS_DIR / "tts.safetensors"
# Cepstral sharpening of the predicted envelope (vocoder.sharpen_envelope), chosen on the 60
# data/tts-eval sentences with the step-5 000 weights: Whisper WER 0.222 at 1.0 (off), 0.194 at
# 1.2, 0.182 at 1.4, 0.185 at 1.6 and 1.8, 0.211 at 2.0; the smallest gain on the plateau.
ENVELOPE_POSTFILTER = 1.4


@dataclass
class TtsConfig:
    width: int = 192
    encoder_depth: int = 3
    decoder_depth: int = 4
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
        self.frame_in = nn.Linear(w + 3, w)
        self.decoder = RecurrentStack(w, config.decoder_depth, 1, config.mlp_ratio)
        self.feature_head = nn.Linear(w, vocoder.N_FEATURES)
        # target normalisation, set from the training data (ships inside the weights file)
        nn.init.constant_(self.duration_head[-1].bias, math.log1p(2.0))  # ~2 frames per id to start
        self.register_buffer("feature_mean", torch.zeros(vocoder.N_FEATURES))
        self.register_buffer("feature_std", torch.ones(vocoder.N_FEATURES))
        self.envelope_postfilter = ENVELOPE_POSTFILTER  # inference only; not in the weights file

    def config_dict(self) -> dict:
        return asdict(self.config)

    # -- encoder: ids -> per-id vectors, LOOKAHEAD ids late ------------------------------------

    def encode(self, ids: Tensor, state: list[BlockState], history: Tensor) -> tuple[Tensor, list[BlockState], Tensor]:
        """ids [B, L] (appended to a stream) -> (vectors [B, L, width] for the ids LOOKAHEAD
        positions earlier, new encoder state, new history of the last LOOKAHEAD embeddings).

        Before LOOKAHEAD ids have been seen the first outputs belong to no id; the caller
        drops them (Synthesizer counts ids)."""
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

    # -- decoder: frames -> vocoder features ---------------------------------------------------

    def decode(self, frame_vectors: Tensor, positions: Tensor, state: list[BlockState]) -> tuple[Tensor, list[BlockState]]:
        """frame_vectors [B, T, w] (each id's vector repeated), positions [B, T, 3] -> (normalised
        features [B, T, N_FEATURES], state). Column 1 (voicing) is a logit."""
        hidden, state = self.decoder(self.frame_in(torch.cat([frame_vectors, positions], dim=-1)), state)
        return self.feature_head(hidden), state

    def denormalise(self, outputs: Tensor) -> Tensor:
        """Decoder outputs -> vocoder features (voicing as 0/1, envelope sharpened)."""
        features = outputs * self.feature_std + self.feature_mean
        voiced = (outputs[..., 1:2] > 0).float()
        envelope = vocoder.sharpen_envelope(features[..., 2:2 + vocoder.N_BANDS], self.envelope_postfilter)
        return torch.cat([features[..., :1], voiced, envelope, features[..., 2 + vocoder.N_BANDS:]], dim=-1)

    # -- training (teacher-forced durations) ---------------------------------------------------

    def forward(self, ids: Tensor, durations: Tensor) -> tuple[Tensor, Tensor]:
        """ids [B, L] (padded with END_ID), durations [B, L] frames -> (log-duration predictions
        [B, L], normalised feature predictions [B, sum(durations) max, N_FEATURES])."""
        batch, length = ids.shape
        k = self.config.lookahead
        padded = torch.cat([ids, torch.full((batch, k), END_ID, dtype=ids.dtype, device=ids.device)], dim=1)
        vectors, _, _ = self.encode(padded, self.encoder.initial_state(batch, ids.device),
                                    self.initial_history(batch, ids.device))
        vectors = vectors[:, k:]
        frame_vectors, positions = expand_frames(vectors, durations)
        outputs, _ = self.decode(frame_vectors, positions, self.decoder.initial_state(batch, ids.device))
        return self.durations(vectors), outputs


def frame_positions(duration: Tensor) -> Tensor:
    """For an id lasting d frames: per frame (fraction done, fraction left, log(1+d)/4) [d, 3]."""
    d = int(duration)
    step = torch.arange(d, dtype=torch.float32, device=duration.device)
    done = (step + 0.5) / max(d, 1)
    return torch.stack([done, 1 - done, torch.full_like(done, math.log1p(d) / 4)], dim=-1)


@functools.lru_cache(maxsize=MAX_FRAMES_PER_ID + 1)
def id_frame_positions(frames: int) -> Tensor:
    """frame_positions for an id of this many frames, made once (streaming asks for every id;
    a shared tensor: read it, never write to it)."""
    return frame_positions(torch.tensor(frames))


def expand_frames(vectors: Tensor, durations: Tensor) -> tuple[Tensor, Tensor]:
    """Repeat each id's vector for its frames: [B, L, w], [B, L] -> [B, T, w], [B, T, 3] (zero-padded)."""
    batch = vectors.shape[0]
    frames = [torch.repeat_interleave(vectors[b], durations[b].clamp(min=0), dim=0) for b in range(batch)]
    positions = [torch.cat([frame_positions(d) for d in durations[b] if int(d) > 0] or
                           [torch.zeros(0, 3, device=vectors.device)]) for b in range(batch)]
    longest = max(1, max(len(f) for f in frames))
    out = vectors.new_zeros(batch, longest, vectors.shape[-1])
    pos = vectors.new_zeros(batch, longest, 3)
    for b in range(batch):
        out[b, : len(frames[b])] = frames[b]
        pos[b, : len(positions[b])] = positions[b]
    return out, pos


def round_durations(log_durations: Tensor) -> Tensor:
    return torch.clamp(torch.round(torch.expm1(log_durations.float().clamp(max=8.0))), 0, MAX_FRAMES_PER_ID).long()


# -- one utterance's bookkeeping (model-free) -------------------------------------------------

@dataclass
class _Pending:
    vector: Tensor  # [w]
    frames: int
    word: Optional[str]  # a word starting at this id


class Schedule:
    """What one utterance has queued, without model state: text -> ids to encode, encoded ids
    waiting for their durations, ready frames, and word marks at the frame cursor.

    The single-stream Synthesizer and the runtime's batched TtsStepper both keep their model
    state elsewhere (a stream's own tensors, or a row of the state pool) and share this.
    """

    def __init__(self, lookahead: int) -> None:
        self.lookahead = lookahead
        self.text = IncrementalText()
        self.ids_seen = 0  # ids fed to the encoder (including END_ID padding)
        self.words: deque[Optional[str]] = deque()  # per fed id, its word start (or None)
        self.ready: deque[_Pending] = deque()
        self.frame_in_id = 0  # frames already taken of ready[0]
        self.frames_out = 0  # frames taken so far
        self.ended = False
        self.word_marks: list[WordMark] = []

    @property
    def done(self) -> bool:
        return self.ended and not self.ready

    def push_text(self, delta: str) -> tuple[list[int], list[Optional[str]]]:
        """Text delta -> (ids to encode now, their word labels); ([], []) until a phrase is stable."""
        return self._ids(self.text.push(delta))

    def end(self) -> tuple[list[int], list[Optional[str]]]:
        """No more text -> the last ids to encode, then LOOKAHEAD END_IDs ("no more text")."""
        ids, labels = self._ids(self.text.end())
        self.ended = True
        return ids + [END_ID] * self.lookahead, labels + [None] * self.lookahead

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

    def add_ready(self, vectors: Tensor, frames: list[int]) -> None:
        for vector, n in zip(vectors, frames):
            self.ready.append(_Pending(vector, n, self.words.popleft()))

    def frames_ready(self) -> int:
        return sum(p.frames for p in self.ready) - self.frame_in_id

    def take(self, limit: int) -> tuple[Optional[Tensor], Optional[Tensor], list[WordMark]]:
        """Up to `limit` ready frames -> (id vectors [T, w], positions [T, 3], word marks);
        (None, None, marks) when no frame is ready."""
        vectors, positions, marks = [], [], []
        taken = 0
        while self.ready and taken < limit:
            head = self.ready[0]
            if self.frame_in_id == 0 and head.word:
                # the vocoder sounds frame t during hop t + 1 (one hop of interpolation)
                sample = (self.frames_out + taken + 1) * HOP
                marks += [WordMark(word, sample) for word in head.word.split(" ")]
            if head.frames == 0:
                self.ready.popleft()
                continue
            take = min(head.frames - self.frame_in_id, limit - taken)
            positions.append(id_frame_positions(head.frames)[self.frame_in_id:self.frame_in_id + take])
            vectors.append(head.vector.expand(take, -1))
            taken += take
            self.frame_in_id += take
            if self.frame_in_id == head.frames:
                self.ready.popleft()
                self.frame_in_id = 0
        self.word_marks += marks
        if not vectors:
            return None, None, marks
        self.frames_out += taken
        return torch.cat(vectors), torch.cat(positions).to(vectors[0].device), marks


@torch.inference_mode()
def encode_ids(model: TtsModel, schedule: Schedule, ids: list[int], labels: list[Optional[str]],
               encoder_state: list[BlockState], history: Tensor) -> tuple[list[BlockState], Tensor]:
    """Feed one stream's new ids (batch of one) to the encoder; ids whose lookahead is now
    known get their durations and join schedule.ready. Returns the new encoder state."""
    if not ids:
        return encoder_state, history
    tensor = torch.tensor([ids], dtype=torch.long, device=history.device)
    vectors, encoder_state, history = inference_model(model).encode(tensor, encoder_state, history)
    own = schedule.encoded(labels)
    if own:
        chosen = vectors[0, own]
        schedule.add_ready(chosen, round_durations(model.durations(chosen)).tolist())
    return encoder_state, history


class FrozenTts:
    """TtsModel.encode and .decode for a CPU in fp32: both SSM stacks frozen with fused
    projections and their RMSNorm gains folded (engine/inference.py, FrozenStack.scan), the
    same outputs within float rounding. Render chunks are 8-32 frames and encoder calls a
    phrase, where op count and small matrix products, not arithmetic, set the time: the
    decoder takes 20-25 % less a chunk than the training module on an AVX2 CPU."""

    def __init__(self, model: TtsModel) -> None:
        self.lookahead = model.config.lookahead
        self.embedding = model.embed.weight.detach().float()
        self.encoder = FrozenStack(model.encoder, int8=False)
        # phoneme_out reads [encoder output after its final RMSNorm, an embedding]: the norm's
        # weight folds into the first half of its columns
        width = model.config.width
        self.phoneme_out = PackedLinear.concat([model.phoneme_out], False,
                                               torch.cat([self.encoder.final_gain, torch.ones(width)]))
        self.frame_in = PackedLinear.concat([model.frame_in], False)
        self.decoder = FrozenStack(model.decoder, int8=False)
        self.feature_head = PackedLinear.concat([model.feature_head], False, self.decoder.final_gain)

    def encode(self, ids: Tensor, state: list[BlockState], history: Tensor) -> tuple[Tensor, list[BlockState], Tensor]:
        batch, length = ids.shape
        embedded = self.embedding[ids]
        hidden, state, norm_gain = self.encoder.scan(embedded, state)
        past = torch.cat([history, embedded], dim=1)
        vectors = self.phoneme_out(torch.cat([hidden * norm_gain, past[:, :length]], dim=-1).reshape(batch * length, -1))
        return vectors.view(batch, length, -1), state, past[:, -self.lookahead:]

    def decode(self, frame_vectors: Tensor, positions: Tensor, state: list[BlockState]) -> tuple[Tensor, list[BlockState]]:
        batch, frames, _ = frame_vectors.shape
        x = self.frame_in(torch.cat([frame_vectors, positions], dim=-1).reshape(batch * frames, -1))
        hidden, state, norm_gain = self.decoder.scan(x.view(batch, frames, -1), state)
        outputs = self.feature_head(hidden.reshape(batch * frames, -1), norm_gain.reshape(batch * frames, 1))
        return outputs.view(batch, frames, -1), state


def inference_model(model: TtsModel) -> Union[TtsModel, FrozenTts]:
    """What encodes and renders streams: the frozen form of an fp32 model on a CPU, else the
    model itself (CUDA's half-precision weights run the model)."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return model
    return cached_freeze(model, "tts", FrozenTts)


@torch.inference_mode()
def render(model: TtsModel, frame_vectors: Tensor, positions: Tensor, decoder_state: list[BlockState],
           vocoder_state: vocoder.VocoderState) -> tuple[Tensor, list[BlockState], vocoder.VocoderState]:
    """Frames of any batch of streams [B, T, w], [B, T, 3] -> (audio [B, T * HOP], states)."""
    outputs, decoder_state = inference_model(model).decode(frame_vectors, positions, decoder_state)
    audio, vocoder_state = vocoder.synthesize(model.denormalise(outputs), vocoder_state)
    return audio, decoder_state, vocoder_state


# -- one stream --------------------------------------------------------------------------------

class Synthesizer:
    """One stream: text deltas in, Audio and WordMark events out, chunk by chunk.

    push_text/end release phrases (engine/text.py); `pull()` renders up to CHUNK_FRAMES
    frames that are ready (their id's LOOKAHEAD successors are known) and returns the events.
    Fixed-size model state: encoder/decoder SSM states, the lookahead history, the vocoder's
    phase and overlap-add memory, plus the Schedule's queue (bounded by the pending text).
    The gateway's streams run on the batched runtime (engine/runtime.py) instead; this is the
    reference it is tested against, and what offline synthesis and the benchmarks use.
    """

    def __init__(self, model: TtsModel, device: str = "cpu") -> None:
        self.model = model.eval()
        self.schedule = Schedule(model.config.lookahead)
        self.encoder_state = model.encoder.initial_state(1, device)
        self.decoder_state = model.decoder.initial_state(1, device)
        self.history = model.initial_history(1, device)
        self.vocoder_state = vocoder.VocoderState.zeros(1, device)
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
            self._encode(*self.schedule.push_text(delta))

    def end(self) -> None:
        if not (self.cancelled or self.schedule.ended):
            self._encode(*self.schedule.end())

    def cancel(self) -> None:
        self.cancelled = True
        self.schedule.ready.clear()

    def _encode(self, ids: list[int], labels: list[Optional[str]]) -> None:
        self.encoder_state, self.history = encode_ids(self.model, self.schedule, ids, labels,
                                                      self.encoder_state, self.history)

    def pull(self) -> list[TtsEvent]:
        """Render the next chunk of ready frames -> events ([] when nothing is ready)."""
        if self.cancelled:
            return []
        vectors, positions, marks = self.schedule.take(self.chunk_frames)
        if vectors is None:
            return list(marks)
        self.chunk_frames = min(CHUNK_FRAMES, 2 * self.chunk_frames)
        audio, self.decoder_state, self.vocoder_state = render(self.model, vectors[None], positions[None],
                                                               self.decoder_state, self.vocoder_state)
        return [*marks, Audio(to_int16(audio[0]), SAMPLE_RATE)]

    def events(self) -> Iterator[TtsEvent]:
        """Everything ready now, chunk by chunk."""
        while True:
            chunk = self.pull()
            if not chunk:
                return
            yield from chunk


def to_int16(audio: Tensor) -> np.ndarray:
    return (audio.clamp(-1, 1) * 32767).round().to(torch.int16).cpu().numpy()


def synthesize_offline(model: TtsModel, text: str) -> tuple[np.ndarray, list[WordMark]]:
    """Whole text at once through the same Synthesizer -> (int16 audio, word marks)."""
    synth = Synthesizer(model)
    synth.push_text(text)
    synth.end()
    pieces = [e.pcm for e in synth.events() if isinstance(e, Audio)]
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    return audio, synth.word_marks


@torch.inference_mode()
def synthesize_parallel(model: TtsModel, ids: list[int]) -> np.ndarray:
    """The fully parallel path (training-style forward with predicted durations): float audio.
    Used to check the streaming path against, and for fast evaluation."""
    k = model.config.lookahead
    tensor = torch.tensor([ids + [END_ID] * k])
    vectors, _, _ = model.encode(tensor, model.encoder.initial_state(1), model.initial_history(1))
    vectors = vectors[:, k:]
    durations = round_durations(model.durations(vectors))
    frame_vectors, positions = expand_frames(vectors, durations)
    outputs, _ = model.decode(frame_vectors, positions, model.decoder.initial_state(1))
    audio, _ = vocoder.synthesize(model.denormalise(outputs))
    return audio[0].numpy()


def load_model(path: Optional[Path] = None, device: str = "cpu") -> TtsModel:
    """The shipped TTS weights, or a .safetensors / training checkpoint (.pt) by path."""
    return weights.load_model(TtsModel, TtsConfig, Path(path) if path else SHIPPED_WEIGHTS, device)
