"""Sweep the end-of-turn rule offline: run the recognizer once, score many rules.

    python -m bench.turn_rule_sweep --data data/stt-eval/kokoro_mix_heldout data/stt-eval/flite_slt --json

The rule (engine/stt.py StreamDecoder) closes a turn when, after TURN_END_QUIET_FRAMES quiet
frames, the head's P(end) combined with the turn table's reaches TURN_END_PROBABILITY:
sigmoid(logit(head) + TURN_TEXT_WEIGHT * clip(logit(table), +-TURN_TEXT_CLIP)), or after 1.2 s
of quiet. Each file streams once with the rule switched off, recording per frame what the rule
would see; then every rule on the grid is replayed over those records and scored as
`engine.bench stt` scores the real thing (per mid-turn pause, per file, end-of-turn latency
against the files' speech spans). Approximate in one way: after a rule closes a turn early the
live decoder starts a new transcript, which the records (one transcript per file) do not, so
confirm the chosen rule with `python -m engine.bench stt`.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from engine import stt
from engine.bench import PUSH_SAMPLES, TRAILING_SILENCE_S, pairs, speech_timing, turn_ends_per_pause
from engine.wavfile import read_wav

Record = tuple[float, float, float, int]  # (audio time s, head P(end), table log odds, quiet frames)


def record_file(model: stt.SttModel, audio: np.ndarray) -> list[Record]:
    """Stream one file with the turn rule off; what the rule would have seen, frame by frame."""
    recognizer = stt.Recognizer(model)
    decoder, records, now = recognizer.decoder, [], [0.0]

    def observe(acoustic: float, greedy: str) -> float:
        records.append((now[0], float(acoustic), decoder.text_log_odds(greedy), decoder._quiet_frames))
        return 0.0  # never closes a turn (the 1.2 s silence rule still does)

    decoder._end_probability = observe
    padded = np.concatenate([audio, np.zeros(int(TRAILING_SILENCE_S * stt.SAMPLE_RATE), np.float32)])
    for start in range(0, len(padded), PUSH_SAMPLES):
        now[0] = (start + PUSH_SAMPLES) / stt.SAMPLE_RATE
        recognizer.push(padded[start:start + PUSH_SAMPLES])
    return records


def turn_ends(records: list[Record], threshold: float, weight: float, clip: float, quiet: int) -> list[float]:
    """When a rule would close turns: once per stretch of quiet, as the decoder does."""
    out, armed = [], True
    for now, acoustic, text, quiet_frames in records:
        armed = armed or quiet_frames == 0
        if not armed:
            continue
        if quiet_frames >= stt.SILENT_TURN_END_FRAMES or (
                quiet_frames >= quiet and stt.combined_end_probability(acoustic, text, weight, clip) >= threshold):
            out.append(now)
            armed = False
    return out


def score(files: list[dict], threshold: float, weight: float, clip: float, quiet: int) -> dict:
    latencies, after_pause, in_speech, early_files = [], [], 0, 0
    for f in files:
        times = turn_ends(f["records"], threshold, weight, clip, quiet)
        charged, before_pauses = turn_ends_per_pause(times, f["pauses"], f["until"])
        after_pause += charged
        in_speech += before_pauses
        early_files += any(t < f["until"] for t in times)
        late = [t for t in times if t >= f["until"]]
        if late:
            latencies.append(late[0] - f["until"])
    return {"threshold": threshold, "text_weight": weight, "text_clip": clip, "quiet_frames": quiet,
            "false_eot_pause_rate": round(sum(after_pause) / max(1, len(after_pause)), 4),
            "false_eot_rate": round(early_files / len(files), 4), "false_eot_in_speech": in_speech,
            "eot_latency_ms_p50": round(1000 * float(np.median(latencies)), 1) if latencies else None,
            "eot_latency_ms_p90": round(1000 * float(np.percentile(latencies, 90)), 1) if latencies else None,
            "eot_missed": len(files) - len(latencies)}


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", required=True, help="folders of NAME.wav + NAME.txt + NAME.json (eval_set)")
    parser.add_argument("--limit", type=int, default=40, help="files per folder")
    parser.add_argument("--weights", help="STT weights (default: shipped)")
    parser.add_argument("--thresholds", type=floats, default=floats("0.85,0.9,0.93,0.95,0.97"))
    parser.add_argument("--text-weights", type=floats, default=floats("1.0,1.5,2.0"))
    parser.add_argument("--clips", type=floats, default=floats("3.0"))
    parser.add_argument("--quiet-frames", type=floats, default=floats("3,4,5"))
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = stt.load_model(Path(args.weights) if args.weights else None)
    files = []
    for folder in args.data:
        for wav, _ in pairs(Path(folder))[: args.limit or None]:
            until, pauses = speech_timing(wav)
            if until is None:
                raise SystemExit(f"{wav}: needs a NAME.json with the speech spans (engine.train.eval_set writes one)")
            files.append({"records": record_file(model, read_wav(wav, stt.SAMPLE_RATE)), "until": until, "pauses": pauses})
    grid = itertools.product(args.thresholds, args.text_weights, args.clips, [int(q) for q in args.quiet_frames])
    current = (stt.TURN_END_PROBABILITY, stt.TURN_TEXT_WEIGHT, stt.TURN_TEXT_CLIP, stt.TURN_END_QUIET_FRAMES)
    print(json.dumps({"benchmark": "turn_rule_sweep", "data": args.data, "files": len(files),
                      "pauses": sum(len(f["pauses"]) for f in files), "shipped_rule": score(files, *current),
                      "rules": [score(files, *rule) for rule in grid]}))


if __name__ == "__main__":
    main()
