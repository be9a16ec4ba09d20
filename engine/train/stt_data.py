"""STT training examples: shards (and real recordings) -> augmented, shuffled, endless stream.

    from engine.train.stt_data import SttDataset
    ds = SttDataset(["data/stt"], real=["/data/LibriSpeech/train-clean-100"], seed=0)
    for ex in make_loader(ds, num_workers=2):  # {"audio": float32[n] 16 kHz, "text": str,
        ...                                    #  "eot": int8[n_frames], "speaker": str, "engine": str}

(A bare DataLoader(ds, batch_size=None) would turn the numpy arrays into tensors;
make_loader keeps them numpy.)

End-of-turn labels, one per 40 ms frame (EOT_FRAME samples, the STT model's frame rate):
    0 SPEECH  the frame overlaps a speech span
    1 PAUSE   silence inside the turn: before the first word, or a mid-turn pause
    2 END     silence after the last word: the turn is over
Labels are computed from the speech spans after augmentation, so they follow speed changes.
"""

import glob
import json
import os

import numpy as np
import torch

from engine.train.augment import Augmenter, AugmentConfig, colored_noise

SAMPLE_RATE = 16000       # Hz
EOT_FRAME = 640           # samples per label frame: 40 ms at 16 kHz
SPEECH, PAUSE, END = 0, 1, 2
SHARDS_OPEN = 4           # shards whose utterances are pooled and shuffled together
MAX_SECONDS = 20.0        # longer examples are skipped (memory per batch)
NON_SPEECH_SHARE = 0.05   # examples of line noise alone: empty transcript, no speech frame
ECHO_RESIDUE_SHARE = 0.05 # examples of speech 40-60 dB down under comfort noise: empty transcript
RESIDUE_DB = (40.0, 60.0)      # attenuation of the echo below a -20 dBFS (RMS) talker
RESIDUE_JITTER_DB = 8.0        # per band and frame: a suppressor's gains are not flat
RESIDUE_BAND_BINS = 16         # STFT bins (500 Hz) sharing one gain
CALL_CONTEXT_SHARE = 0.0  # examples heard after an earlier turn and a reply's worth of line (call_context_example)
CALL_GAP_S = (1.0, 8.0)   # how long Parley answered in between
CALL_MAX_FACTOR = 1.5     # a call-context example may be this much longer than max_seconds


def eot_labels(n_samples: int, spans) -> np.ndarray:
    """Per-frame labels (int8) for audio of n_samples with speech in `spans` [start, end)."""
    n = -(-n_samples // EOT_FRAME)
    labels = np.full(n, PAUSE, np.int8)
    spans = [(s, e) for s, e in spans if e > s]
    if not spans:
        return labels
    last_end = max(e for _, e in spans)
    labels[-(-last_end // EOT_FRAME):] = END
    for s, e in spans:
        labels[s // EOT_FRAME: -(-e // EOT_FRAME)] = SPEECH
    return labels


def read_shard(path: str) -> list[dict]:
    """All utterances of one shard: dicts with int16 `pcm` plus the shard metadata."""
    with np.load(path) as z:
        audio, offsets = z["audio"], z["offsets"]
        meta = json.loads(z["meta"].tobytes().decode())
    for i, m in enumerate(meta):
        m["pcm"] = audio[offsets[i]:offsets[i + 1]]
    return meta


def list_shards(dirs) -> list[str]:
    """Finished shards (their summary .json exists) under the given folders."""
    out = []
    for d in dirs:
        for p in sorted(glob.glob(os.path.join(d, "shard-?????.npz"))):
            if os.path.exists(p[:-4] + ".json"):
                out.append(p)
    return out


DTMF_LOW, DTMF_HIGH = (697, 770, 852, 941), (1209, 1336, 1477)  # Hz, a keypad's row and column tones


def line_tones(rng: np.random.Generator, n: int) -> np.ndarray:
    """Periodic sounds a call carries that are not speech, at unit peak: keypad (DTMF) digits,
    mains hum, a steady beep, a buzz (square or sawtooth wave)."""
    t = np.arange(n) / SAMPLE_RATE
    kind = rng.integers(4)
    if kind == 0:
        x = np.zeros(n)
        at = int(rng.uniform(0.0, 0.5) * SAMPLE_RATE)
        while at < n:
            length = int(rng.uniform(0.04, 0.3) * SAMPLE_RATE)
            tone = sum(np.sin(2 * np.pi * f * t[:length]) for f in (rng.choice(DTMF_LOW), rng.choice(DTMF_HIGH)))
            x[at:at + length] = tone[: n - at]
            at += length + int(rng.uniform(0.04, 0.6) * SAMPLE_RATE)
    elif kind == 1:
        f0 = rng.choice((50.0, 60.0))
        x = sum(rng.uniform(0.1, 1.0) / k * np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 6.3)) for k in range(1, 8))
    elif kind == 2:
        x = np.sin(2 * np.pi * rng.uniform(200.0, 3000.0) * t)
    else:
        phase = (rng.uniform(50.0, 1000.0) * t) % 1.0
        x = np.where(phase < 0.5, 1.0, -1.0) if rng.random() < 0.5 else 2.0 * phase - 1.0
    return (x / max(float(np.max(np.abs(x))), 1e-8)).astype(np.float32)


def non_speech_example(rng: np.random.Generator) -> dict:
    """1-6 s of what a line carries between words: digital silence, white to brown noise from
    -75 to -35 dBFS, or tones (keypad digits, hum, beeps, buzz) from -40 to 0 dBFS. Without
    these the model learns that sound is always speech, and reads comfort noise as "mmmm"."""
    n = int(rng.uniform(1.0, 6.0) * SAMPLE_RATE)
    kind = rng.random()
    if kind < 0.1:
        x = np.zeros(n, np.float32)
    elif kind < 0.6:
        x = colored_noise(rng, n, float(rng.uniform(0.0, 2.0))) * 10 ** (rng.uniform(-75, -35) / 20)
    else:
        x = line_tones(rng, n) * 10 ** (rng.uniform(-40, 0) / 20)
        x = x + colored_noise(rng, n, 1.0) * 10 ** (rng.uniform(-80, -55) / 20)
    return {"audio": x.astype(np.float32), "text": "", "eot": eot_labels(n, []), "speaker": "none",
            "engine": "noise"}


def echo_residue_example(rng: np.random.Generator, speech: np.ndarray) -> dict:
    """What an echo suppressor leaves of Parley's own voice: the speech far below any caller
    (the quietest training speech is about -44 dBFS RMS; this is -80 to -60), gated band by
    band, under comfort noise. Labelled as no speech, so the model does not write vowels
    on it and barge in on itself."""
    x = speech / max(float(np.sqrt(np.mean(speech ** 2))), 1e-8) * 0.1
    spec = torch.stft(torch.from_numpy(x), 512, 128, window=torch.hann_window(512), return_complex=True)
    bands = -(-spec.shape[0] // RESIDUE_BAND_BINS)
    gains_db = -rng.uniform(*RESIDUE_DB) + rng.uniform(-RESIDUE_JITTER_DB, RESIDUE_JITTER_DB, (bands, spec.shape[1]))
    gains = torch.from_numpy(np.repeat(10 ** (gains_db / 20), RESIDUE_BAND_BINS, 0)[: spec.shape[0]])
    y = torch.istft(spec * gains, 512, 128, window=torch.hann_window(512), length=len(x)).numpy()
    y = y + colored_noise(rng, len(y), float(rng.uniform(0.0, 2.0))) * 10 ** (rng.uniform(-80, -55) / 20)
    return {"audio": y.astype(np.float32), "text": "", "eot": eot_labels(len(y), []), "speaker": "echo",
            "engine": "echo_residue"}


def call_context_example(rng: np.random.Generator, earlier: dict, current: dict, max_samples: int) -> "dict | None":
    """`current` as a call's later turn: `earlier` turn, then 1-8 s of what the recognizer
    hears while Parley answers (digital silence, faint noise, or Parley's voice far down
    under comfort noise), then `current`. A live recognizer carries its state through all of
    that; trained only on single turns, its end-of-turn output came to depend on audio heard
    tens of seconds before (bench/replay_call.py). Everything from the earlier turn's end
    to the current turn's first word is labelled END: the earlier turn is over, and nobody
    has started the next. None when the whole would be longer than max_samples."""
    head = np.pad(earlier["audio"], (0, -len(earlier["audio"]) % EOT_FRAME))
    gap_n = int(rng.uniform(*CALL_GAP_S) * SAMPLE_RATE) // EOT_FRAME * EOT_FRAME
    if len(head) + gap_n + len(current["audio"]) > max_samples:
        return None
    kind = rng.random()
    if kind < 0.4:
        gap = np.zeros(gap_n, np.float32)
    elif kind < 0.7:
        gap = colored_noise(rng, gap_n, float(rng.uniform(0.0, 2.0))) * 10 ** (rng.uniform(-75, -45) / 20)
    else:
        gap = echo_residue_example(rng, np.resize(earlier["audio"], gap_n))["audio"]
    labels = np.concatenate([earlier["eot"][:len(head) // EOT_FRAME], np.full(gap_n // EOT_FRAME, END, np.int8),
                             current["eot"]])
    first_word = np.flatnonzero(labels[len(head) // EOT_FRAME:] == SPEECH)
    last_end = len(head) // EOT_FRAME
    labels[last_end:last_end + (int(first_word[0]) if len(first_word) else 0)] = END
    return {"audio": np.concatenate([head, gap.astype(np.float32), current["audio"]]),
            "text": f"{earlier['text']} {current['text']}".strip(), "eot": labels,
            "speaker": current["speaker"], "engine": current["engine"]}


def make_example(pcm, spans, text: str, speaker: str, engine: str, augment: Augmenter | None) -> dict:
    """One training example in the format the trainer consumes."""
    x = pcm.astype(np.float32) / 32768.0 if pcm.dtype == np.int16 else np.asarray(pcm, np.float32)
    if augment is not None:
        x, spans = augment(x, spans)
    return {"audio": x, "text": text, "eot": eot_labels(len(x), spans),
            "speaker": speaker, "engine": engine}


class SttDataset(torch.utils.data.IterableDataset):
    """Endless, shuffled, augmented examples from shard folders and real-recording folders.

    Worker-safe: each DataLoader worker (and each `rank` of `world_size` for multi-GPU
    training) reads a disjoint subset of the shards and seeds its own random streams.
    The shard list is re-read every pass, so shards written by a synthesis run still in
    progress join the stream as they finish.
    """

    def __init__(self, shard_dirs=("data/stt",), real=(), seed: int = 0, augment: bool = True,
                 augment_config: AugmentConfig | None = None, real_weight: float = 0.5,
                 rank: int = 0, world_size: int = 1, max_seconds: float = MAX_SECONDS,
                 non_speech_share: float = NON_SPEECH_SHARE, echo_residue_share: float = ECHO_RESIDUE_SHARE,
                 call_context_share: float = CALL_CONTEXT_SHARE):
        super().__init__()
        self.non_speech_share, self.echo_residue_share = non_speech_share, echo_residue_share
        self.call_context_share = call_context_share
        self.shard_dirs, self.real, self.seed = list(shard_dirs), list(real), seed
        self.augment, self.augment_config = augment, augment_config
        self.real_weight = real_weight if self.real else 0.0
        self.rank, self.world_size, self.max_samples = rank, world_size, int(max_seconds * SAMPLE_RATE)

    def _stream_id(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        return self.rank * nw + wid, self.world_size * nw

    def __iter__(self):
        sid, n_streams = self._stream_id()
        rng = np.random.default_rng([self.seed, sid])
        aug = Augmenter(seed=int(rng.integers(2**31)), config=self.augment_config) if self.augment else None
        synth = self._synthetic(rng, aug, sid, n_streams)
        real = self._real(rng, aug, sid, n_streams) if self.real else None
        earlier = None  # the last turn with words: a call's earlier turn for call_context_example
        while True:
            if rng.random() < self.non_speech_share:
                yield non_speech_example(rng)
                continue
            src = real if real is not None and rng.random() < self.real_weight else synth
            ex = next(src, None)
            if ex is None:
                if src is synth and real is not None:
                    synth = self._synthetic(rng, aug, sid, n_streams)   # no shards yet: real only
                    ex = next(real)
                else:
                    raise RuntimeError(f"no training data in {self.shard_dirs} {self.real}")
            if rng.random() < self.echo_residue_share:
                ex = echo_residue_example(rng, ex["audio"])
            elif ex["text"]:
                in_call = None
                if earlier is not None and rng.random() < self.call_context_share:
                    in_call = call_context_example(rng, earlier, ex, int(self.max_samples * CALL_MAX_FACTOR))
                earlier = ex
                ex = in_call or ex
            yield ex

    def _synthetic(self, rng, aug, sid: int, n_streams: int):
        """Passes over this stream's shards, SHARDS_OPEN at a time, shuffled within the pool."""
        while True:
            shards = list_shards(self.shard_dirs)
            mine = shards[sid::n_streams] if len(shards) >= n_streams else shards  # few: all read all
            if not mine:
                return
            rng.shuffle(mine)
            for i in range(0, len(mine), SHARDS_OPEN):
                pool = [u for p in mine[i:i + SHARDS_OPEN] for u in read_shard(p)]
                for j in rng.permutation(len(pool)):
                    u = pool[j]
                    if len(u["pcm"]) <= self.max_samples:
                        yield make_example(u["pcm"], u["spans"], u["text"], u["speaker"], u["engine"], aug)

    def _real(self, rng, aug, sid: int, n_streams: int):
        from engine.train.real_data import RealRecordings
        recs = RealRecordings(self.real)
        items = [it for k, it in enumerate(recs.items) if k % n_streams == sid] or recs.items
        while True:
            for j in rng.permutation(len(items)):
                ex = recs.load(items[j], rng)
                if ex is not None and len(ex["pcm"]) <= self.max_samples:
                    yield make_example(ex["pcm"], ex["spans"], ex["text"], ex["speaker"], "real", aug)


def keep_numpy(example: dict) -> dict:
    """DataLoader collate_fn that leaves an example as it is (numpy arrays stay numpy)."""
    return example


def make_loader(dataset: SttDataset, num_workers: int = 2) -> torch.utils.data.DataLoader:
    """Examples one at a time from `num_workers` background processes (0: in-process)."""
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers,
                                       collate_fn=keep_numpy, persistent_workers=num_workers > 0)
