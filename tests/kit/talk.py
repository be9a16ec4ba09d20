"""A caller that talks: recorded utterances played into an aiortc Caller on cue, and the
events of one conversation turn awaited in order (bench/reconnect.py, bench/soak.py,
bench/impairment.py and the conversation fault tests share it)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from engine.wavfile import read_wav
from tests.kit.peer import RATE, Caller
from tests.kit.signals import resample

SPEECH = Path(__file__).resolve().parent.parent / "data" / "speech"  # flite slt, held out of training
UTTERANCES = ("flite_slt-020.wav", "flite_slt-021.wav")


def utterance(path: Path | str) -> np.ndarray:
    """A recording at 48 kHz float32 (a bare name is one of the test utterances)."""
    path = Path(path)
    speech = read_wav(path if path.is_absolute() else SPEECH / path, 16000).astype(np.float32)
    return resample(speech / 32768 if np.abs(speech).max() > 1 else speech, 16000, RATE)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), np.float32)


def say(caller: Caller, speech: np.ndarray, lead_s: float = 0.3, tail_s: float = 30.0) -> None:
    """The caller says `speech` from `lead_s` after now, then is silent (the track plays its
    samples by position, so everything before now stays as it was sent)."""
    now = caller.track._pts / RATE
    caller.track.samples = np.concatenate([silence(now + lead_s), speech, silence(tail_s)])


def last_seq(caller: Caller) -> int:
    return max(caller.seqs(), default=0)


async def next_event(caller: Caller, type_: str, after_seq: int, timeout: float,
                     turn: Optional[int] = None) -> dict:
    """The first `type_` event numbered after `after_seq` (and of `turn`, if given)."""
    return await caller.wait_for_event(
        type_, timeout, where=lambda e: e["seq"] > after_seq and (turn is None or e.get("turn") == turn))
