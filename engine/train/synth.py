"""Synthesize the STT training set into shards, resumably, in the background.

    nohup nice -n 19 .venv/bin/python -m engine.train.synth --out data/stt --hours 20 &
    nohup nice -n 19 .venv/bin/python -m engine.train.synth --out data/stt-short --corpus short --hours 0.8 &
    nohup nice -n 19 .venv/bin/python -m engine.train.synth --out data/stt-general --corpus general --hours 3 &
    nohup nice -n 19 .venv/bin/python -m engine.train.synth --out data/stt-shifted --voices shifted --hours 3 --seed 2031 --shard-size 100 &
    python -m engine.train.synth --out data/stt --report      # hours and speed per engine

Shard k is `OUT/shard-KKKKK.npz` (16 kHz int16 audio of all its utterances, their
offsets, and JSON metadata) plus `OUT/shard-KKKKK.json` (a summary, written last: a shard
is finished iff its .json exists, so an interrupted run resumes where it stopped).
Everything in shard k is a function of (--seed, k): texts walk a fixed permutation of the
training text split, speakers are drawn from the fixed training pools of voices.py.

Per utterance metadata: text (normalized target), speaker, engine, kind, and `spans`, the
[start, end) sample ranges of speech. An utterance with mid-turn pauses is made by
synthesizing its segments separately and joining them with PAUSE_RANGE of silence; the
end-of-turn labels (stt_data.eot_labels) are computed from the spans after augmentation.
"""

import argparse
import glob
import json
import logging
import multiprocessing as mp
import os
import time

import numpy as np

from engine.train import voices
from engine.train.corpus import SEED, build_corpus, general_corpus, short_turn_corpus, split_corpus

SAMPLE_RATE = voices.SAMPLE_RATE  # Hz
SHARD_UTTERANCES = 200            # ~15 min of audio per shard
P_PAUSE = 0.6                     # chance a segment boundary becomes a real pause
PAUSE_RANGE = (0.3, 0.9)          # s of silence at a mid-turn pause
LEAD_RANGE = (0.1, 0.5)           # s of silence before the first word
TAIL_RANGE = (0.6, 1.5)           # s of silence after the last word (end of turn)
MAX_TRIES = 3                     # speakers tried before an utterance is skipped
ENGINES = tuple(voices.ENGINE_WEIGHTS)  # what a shard's summary accounts for (a pool's speakers are of these)

log = logging.getLogger("synth")


def render(synth, speaker: voices.Speaker, segments, rng: np.random.Generator,
           p_pause: float = P_PAUSE, pause_range=PAUSE_RANGE, tail_range=TAIL_RANGE):
    """Speak `segments` with real pauses at some boundaries.

    Returns (float32 audio, spans, groups): spans are the [start, end) speech ranges,
    groups the text spoken in each span.
    """
    groups, cur = [], [segments[0]]
    for seg in segments[1:]:
        if rng.random() < p_pause:
            groups.append(" ".join(cur))
            cur = [seg]
        else:
            cur.append(seg)
    groups.append(" ".join(cur))
    pieces, spans = [_silence(rng, LEAD_RANGE)], []
    pos = len(pieces[0])
    for i, g in enumerate(groups):
        audio = synth(speaker, g)
        if len(audio) < 0.1 * SAMPLE_RATE:
            raise RuntimeError(f"{speaker.engine} returned {len(audio)} samples")
        if i:
            gap = _silence(rng, pause_range)
            pieces.append(gap)
            pos += len(gap)
        pieces.append(audio)
        spans.append([pos, pos + len(audio)])
        pos += len(audio)
    pieces.append(_silence(rng, tail_range))
    return np.concatenate(pieces), spans, groups


def _silence(rng: np.random.Generator, seconds_range) -> np.ndarray:
    return np.zeros(int(rng.uniform(*seconds_range) * SAMPLE_RATE), np.float32)


def shard_path(out: str, k: int, ext: str) -> str:
    return os.path.join(out, f"shard-{k:05d}.{ext}")


CORPORA = {"main": build_corpus, "short": short_turn_corpus, "general": general_corpus}  # --corpus: which texts to speak


class ShardPlan:
    """What shard k contains: deterministic texts and speakers."""

    def __init__(self, seed: int = SEED, shard_size: int = SHARD_UTTERANCES, corpus: str = "main",
                 voice_mix: str = "all"):
        self.seed, self.shard_size = seed, shard_size
        self.train, _ = split_corpus(CORPORA[corpus](seed))
        self.order = np.random.default_rng([seed, 1]).permutation(len(self.train))
        shares = voices.VOICE_MIXES[voice_mix]
        self.pool_names = tuple(shares)
        self.pools = {e: voices.training_speakers(e) for e in self.pool_names}
        self.weights = np.array([shares[e] for e in self.pool_names])

    def utterance(self, k: int, i: int):
        return self.train[self.order[(k * self.shard_size + i) % len(self.order)]]

    def speaker(self, rng: np.random.Generator) -> voices.Speaker:
        name = self.pool_names[rng.choice(len(self.pool_names), p=self.weights / self.weights.sum())]
        pool = self.pools[name]
        return pool[int(rng.integers(len(pool)))]


def write_shard(plan: ShardPlan, synth, out: str, k: int) -> dict:
    """Synthesize shard k and write it atomically; return its summary."""
    rng = np.random.default_rng([plan.seed, 2, k])
    audio, meta = [], []
    engine_audio = dict.fromkeys(ENGINES, 0.0)
    engine_time = dict.fromkeys(ENGINES, 0.0)
    for i in range(plan.shard_size):
        utt = plan.utterance(k, i)
        for _ in range(MAX_TRIES):
            sp = plan.speaker(rng)
            assert not voices.is_heldout(sp), sp
            t0 = time.perf_counter()
            try:
                x, spans, groups = render(synth, sp, utt.segments, rng)
            except Exception as e:  # a voice that fails on one text: try another voice
                log.warning("shard %d utt %d %s failed: %s", k, i, sp.id, e)
                continue
            engine_time[sp.engine] += time.perf_counter() - t0
            engine_audio[sp.engine] += sum(e - s for s, e in spans) / SAMPLE_RATE
            audio.append(np.clip(x * 32767, -32768, 32767).astype(np.int16))
            meta.append({"text": utt.text, "speaker": sp.id, "engine": sp.engine, "kind": utt.kind,
                         "spans": spans, "groups": groups, "params": sp.params})
            break
    offsets = np.cumsum([0] + [len(a) for a in audio]).astype(np.int64)
    summary = {"shard": k, "seed": plan.seed, "n": len(meta),
               "seconds": float(offsets[-1] / SAMPLE_RATE),
               "speech_seconds": engine_audio, "synth_seconds": engine_time,
               "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = shard_path(out, k, "tmp.npz")
    np.savez(tmp, audio=np.concatenate(audio), offsets=offsets,
             meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    os.replace(tmp, shard_path(out, k, "npz"))
    with open(shard_path(out, k, "tmp.json"), "w") as f:
        json.dump(summary, f)
    os.replace(shard_path(out, k, "tmp.json"), shard_path(out, k, "json"))
    return summary


def summaries(out: str) -> list[dict]:
    res = []
    for p in sorted(glob.glob(os.path.join(out, "shard-?????.json"))):
        with open(p) as f:
            res.append(json.load(f))
    return res


def done_hours(out: str) -> float:
    return sum(s["seconds"] for s in summaries(out)) / 3600


def report(out: str) -> dict:
    """Hours of audio and synthesis speed (x real time, speech only) per engine."""
    ss = summaries(out)
    r = {"shards": len(ss), "hours": sum(s["seconds"] for s in ss) / 3600, "engines": {}}
    for e in ENGINES:
        a = sum(s["speech_seconds"][e] for s in ss)
        t = sum(s["synth_seconds"][e] for s in ss)
        r["engines"][e] = {"speech_hours": a / 3600, "x_realtime": a / t if t else None}
    return r


def worker(out: str, seed: int, hours: float, index: int, n_workers: int, shard_size: int,
           corpus: str = "main", voice_mix: str = "all") -> None:
    """Write shards index, index + n_workers, ... until the folder holds `hours` of audio."""
    _setup_log(out)
    plan = ShardPlan(seed, shard_size, corpus, voice_mix)
    synth = voices.Engines()
    k = index
    while True:
        if os.path.exists(shard_path(out, k, "json")):
            k += n_workers
            continue
        have = done_hours(out)
        if have >= hours:
            log.info("worker %d: %.2f h >= %.2f h, done", index, have, hours)
            return
        t0 = time.time()
        s = write_shard(plan, synth, out, k)
        speed = {e: round(s["speech_seconds"][e] / t, 1) for e, t in s["synth_seconds"].items() if t}
        log.info("shard %d: %d utts %.1f min audio in %.1f min, x realtime %s; total %.2f/%.1f h",
                 k, s["n"], s["seconds"] / 60, (time.time() - t0) / 60, speed, have + s["seconds"] / 3600, hours)
        k += n_workers


def _setup_log(out: str) -> None:
    logging.basicConfig(filename=os.path.join(out, "synth.log"), level=logging.INFO,
                        format="%(asctime)s pid=%(process)d %(levelname)s %(message)s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/stt")
    p.add_argument("--hours", type=float, default=20.0, help="stop when the folder holds this much audio")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--workers", type=int, default=1, help="processes (one ONNX thread each)")
    p.add_argument("--shard-size", type=int, default=SHARD_UTTERANCES, help="utterances per shard")
    p.add_argument("--corpus", choices=sorted(CORPORA), default="main",
                   help="main: prose and contact-center turns; short: short complete answers; general: prose alone (own folders)")
    p.add_argument("--voices", choices=sorted(voices.VOICE_MIXES), default="all",
                   help="all: every engine's pool; shifted: WORLD-shifted flite and espeak-ng speakers (own folder)")
    p.add_argument("--report", action="store_true", help="print hours and speed per engine, then exit")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.report:
        print(json.dumps(report(a.out), indent=1))
        return
    _setup_log(a.out)
    log.info("start: out=%s corpus=%s voices=%s hours=%.1f seed=%d workers=%d shard_size=%d", a.out, a.corpus, a.voices,
             a.hours, a.seed, a.workers, a.shard_size)
    procs = [mp.Process(target=worker, args=(a.out, a.seed, a.hours, i, a.workers, a.shard_size, a.corpus, a.voices)) for i in range(a.workers)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    log.info("finished: %s", json.dumps(report(a.out)))


if __name__ == "__main__":
    main()
