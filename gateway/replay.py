"""`parley replay REC.wav`: a recorded call replayed through the echo suppressor and the
recognizer, offline.

A gateway started with `record_dir` writes what the recognizer's side of each call was
given (gateway/recording.py). This replays it frame for frame, as the conversation did, and
reports per caller turn: when the recognizer heard speech start and when it ended the turn.
Each turn is decoded twice, side by side:

- `call`: one recognizer over the whole call, as live;
- `fresh`: a new recognizer started `--fresh-lead` seconds before the turn.

The two see the same audio for the turn itself and differ only in what came before, so
`history_shift_ms` measures how much a turn's end-of-turn decision depends on the call's
earlier audio (a streaming model's state should forget it; one that does not turns the same
words into turns that end 100 ms or 1.3 s after the last word).

The recognizer is Parley's SSM recognizer, which decides when speech starts and when a turn
ends whatever `stt_model` reads the words (engine/models.py).

    parley replay recordings/20261130T170000-ses_x.wav --json
"""

from __future__ import annotations

import argparse
import json
import sys
import wave
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .echo_suppressor import FRAME, EchoSuppressor
from .recording import SAMPLE_RATE, read_recording

SOUND_DBFS = -50.0  # a 20 ms inbound frame above this carries the caller's sound
TURN_GAP_S = 1.0  # quieter stretches shorter than this stay inside one turn (the v2v bench's rule)


def suppress(inbound: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """What the recognizer heard: the suppressor over the call, frame by frame, as live."""
    suppressor = EchoSuppressor()
    out = []
    for start in range(0, len(inbound) - FRAME + 1, FRAME):
        suppressor.add_reference(reference[start:start + FRAME])
        out.append(suppressor.process(inbound[start:start + FRAME]))
    return np.concatenate(out) if out else np.zeros(0, np.int16)


def caller_turns(inbound: np.ndarray) -> list[tuple[float, float]]:
    """(start s, end s) of the caller's sound, pauses under TURN_GAP_S kept inside a turn."""
    frames = inbound[:len(inbound) // FRAME * FRAME].astype(np.float64).reshape(-1, FRAME)
    level = 20 * np.log10(np.sqrt(np.mean(frames ** 2, axis=1)) / 32768 + 1e-12)
    turns: list[list[float]] = []
    for i in np.flatnonzero(level > SOUND_DBFS):
        start, end = i * FRAME / SAMPLE_RATE, (i + 1) * FRAME / SAMPLE_RATE
        if turns and start - turns[-1][1] < TURN_GAP_S:
            turns[-1][1] = end
        else:
            turns.append([start, end])
    return [(a, b) for a, b in turns]


def recognize(model: Any, audio: np.ndarray, offset_s: float,
              turn_end_probability: Optional[float] = None) -> list[tuple[float, str]]:
    """(time s on the call's clock, "start" | "end") for every SpeechStart and EndOfTurn.
    model: engine.load_ssm_model()'s."""
    import engine

    recognizer, events = engine.ssm_recognizer(model, turn_end_probability=turn_end_probability), []
    for start in range(0, len(audio), FRAME):
        for event in recognizer.push(audio[start:start + FRAME]):
            if isinstance(event, (engine.SpeechStart, engine.EndOfTurn)):
                kind = "start" if isinstance(event, engine.SpeechStart) else "end"
                events.append((offset_s + (start + FRAME) / SAMPLE_RATE, kind))
    return events


def first_after(events: list[tuple[float, str]], kind: str, t: float, until: float) -> Optional[int]:
    """ms from t to the first `kind` event in [t - 0.1 s, until), or None."""
    for when, what in events:
        if what == kind and t - 0.1 <= when < until:
            return round((when - t) * 1000)
    return None


def replay(inbound: np.ndarray, reference: np.ndarray, model: Any, fresh_lead_s: float,
           turn_end_probability: Optional[float] = None) -> dict:
    """The report for one recording's two channels; model: engine.load_ssm_model()'s."""
    heard = suppress(inbound, reference)
    whole = recognize(model, heard, 0.0, turn_end_probability)
    turns = caller_turns(inbound)
    rows = []
    for i, (start, end) in enumerate(turns):
        until = turns[i + 1][0] if i + 1 < len(turns) else len(heard) / SAMPLE_RATE + 1
        begin = max(0.0, start - fresh_lead_s)
        fresh = recognize(model, heard[int(begin * SAMPLE_RATE):int(until * SAMPLE_RATE)], begin, turn_end_probability)
        reference_active = bool(np.abs(reference[int(start * SAMPLE_RATE):int((start + 0.1) * SAMPLE_RATE)]).max(initial=0) > 0)
        row = {"start_s": round(start, 2), "end_s": round(end, 2), "over_reply": reference_active,
               "speech_start_ms": first_after(whole, "start", start, end),
               "ended_early": sum(1 for when, what in whole if what == "end" and start < when < end - 0.1),
               "end_of_turn_ms": {"call": first_after(whole, "end", end, until),
                                  "fresh": first_after(fresh, "end", end, until)}}
        call_ms, fresh_ms = row["end_of_turn_ms"]["call"], row["end_of_turn_ms"]["fresh"]
        row["history_shift_ms"] = None if call_ms is None or fresh_ms is None else call_ms - fresh_ms
        rows.append(row)
    return {"turns": rows, **summary(rows), "duration_s": round(len(inbound) / SAMPLE_RATE, 2)}


def _percentiles(values: list[float]) -> dict:
    """p50, p95 and the mean: a call cycles a few clips, and when some of them always end late
    the turn-end times fall in two groups, where the p50 jumps between them on small changes."""
    if not values:
        return {"p50": None, "p95": None, "mean": None, "n": 0}
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
            "mean": round(float(np.mean(values)), 1), "n": len(values)}


def summary(rows: list[dict]) -> dict:
    shifts = [abs(r["history_shift_ms"]) for r in rows if r["history_shift_ms"] is not None]
    return {
        "end_of_turn_ms": {kind: _percentiles([r["end_of_turn_ms"][kind] for r in rows
                                               if r["end_of_turn_ms"][kind] is not None]) for kind in ("call", "fresh")},
        "speech_start_ms": _percentiles([r["speech_start_ms"] for r in rows if r["speech_start_ms"] is not None]),
        "history_shift_ms_abs": _percentiles(shifts),
        "turns_shifted_over_100ms": sum(1 for s in shifts if s > 100),
        "turns_ended_early": sum(1 for r in rows if r["ended_early"]),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", type=Path, help="a WAV written by a gateway with record_dir set")
    parser.add_argument("--stt-weights", type=Path, default=None,
                        help="the SSM recognizer's safetensors (default: shipped)")
    parser.add_argument("--fresh-lead", type=float, default=2.0, help="s of audio a fresh recognizer hears before each turn")
    parser.add_argument("--turn-end-probability", type=float, default=None,
                        help="P(end) that closes a turn (default: the engine's)")
    parser.add_argument("--json", action="store_true", help="print the full JSON report")


def run(args: argparse.Namespace) -> int:
    """`parley replay`: the report printed; 2 with a message when the file is not a recording."""
    import engine

    try:
        inbound, reference = read_recording(args.recording)
    except (OSError, EOFError, ValueError, wave.Error) as exc:
        print(f"parley replay: {exc}", file=sys.stderr)
        return 2
    engine.use_threads(1)
    report = replay(inbound, reference, engine.load_ssm_model(args.stt_weights), args.fresh_lead,
                    args.turn_end_probability)
    report["settings"] = {"recording": str(args.recording), "stt_weights": str(args.stt_weights or ""),
                          "fresh_lead_s": args.fresh_lead, "turn_end_probability": args.turn_end_probability}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for row in report["turns"]:
        print(f"{row['start_s']:8.2f}-{row['end_s']:<8.2f} over reply: {row['over_reply']!s:5} "
              f"speech start {row['speech_start_ms']} ms, end of turn {row['end_of_turn_ms']['call']} ms "
              f"(fresh: {row['end_of_turn_ms']['fresh']} ms), ended early {row['ended_early']}x")
    print(json.dumps({k: v for k, v in report.items() if k != "turns"}))
    return 0
