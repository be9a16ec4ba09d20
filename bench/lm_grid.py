"""Grid over the beam search's LM weight, word bonus and width: one model pass per file, many decodings.

    python -m bench.lm_grid --data data/stt-eval-120/kokoro_mix_heldout data/stt-eval-120/flite_slt \
        --alphas 0.3,0.4,0.5 --bonuses 1.5,2.5,3.5 [--widths 16,32,64] --json

Each file goes through the model once (the float forward pass, as `transcribe` decodes offline);
its per-frame candidate tokens are kept, and every (alpha, beta, width) on the grid decodes them
with `engine.beam.CtcBeamSearch` and the shipped LM (decode_s: the seconds it took, all files).
WER per folder, with the normalizer the bench uses. Offline, so it ignores what streaming adds (a turn closed early splits a transcript):
confirm a choice with `python -m engine.bench stt`. Choose on folders that are not blind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from bench.turn_rule_sweep import floats
from engine import beam, stt
from engine.bench import pairs
from engine.wer import normalize_for_wer
from engine.wavfile import read_wav
from engine.wer import word_error_rate

Candidates = list[list[tuple[int, float]]]


def frame_candidates(model: stt.SttModel, wav: Path) -> Candidates:
    """A file's per-frame likeliest tokens, as the beam search reads them."""
    return stt.frame_candidates(stt.offline_ctc_logits(model, read_wav(wav, stt.SAMPLE_RATE)))


def decode(candidates: Candidates, lm, alpha: float, bonus: float, width: int = beam.BEAM_WIDTH) -> str:
    search = beam.CtcBeamSearch(lm, stt.VOCAB, stt.BLANK, lm_weight=alpha, word_bonus=bonus, beam_width=width)
    for frame, tokens in enumerate(candidates):
        search.push(tokens, frame)
    return " ".join(search.best()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", required=True, help="folders of NAME.wav + NAME.txt")
    parser.add_argument("--limit", type=int, default=0, help="files per folder (0: all)")
    parser.add_argument("--weights", help="STT weights (default: shipped)")
    parser.add_argument("--lm", help="ARPA file (default: shipped)")
    parser.add_argument("--alphas", type=floats, default=floats(f"0.3,{beam.LM_WEIGHT},0.5"))
    parser.add_argument("--bonuses", type=floats, default=floats(f"1.5,{beam.WORD_BONUS},3.5"))
    parser.add_argument("--widths", type=floats, default=[beam.BEAM_WIDTH], help="beam widths")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = stt.load_model(Path(args.weights) if args.weights else None)
    lm = stt.resolve_lm(Path(args.lm) if args.lm else stt.SHIPPED)
    files = [(Path(folder).name, normalize_for_wer(text), frame_candidates(model, wav))
             for folder in args.data for wav, text in pairs(Path(folder))[: args.limit or None]]
    grid = []
    for alpha, bonus, width in itertools.product(args.alphas, args.bonuses, [int(w) for w in args.widths]):
        refs: dict[str, tuple[list[str], list[str]]] = {}
        started = time.perf_counter()
        for folder, ref, candidates in files:
            refs.setdefault(folder, ([], []))
            refs[folder][0].append(ref)
            refs[folder][1].append(normalize_for_wer(decode(candidates, lm, alpha, bonus, width)))
        wers = {folder: round(word_error_rate(r, h), 4) for folder, (r, h) in refs.items()}
        grid.append({"lm_weight": alpha, "word_bonus": bonus, "beam_width": width,
                     "mean_wer": round(sum(wers.values()) / len(wers), 4), "wer": wers,
                     "decode_s": round(time.perf_counter() - started, 2)})
    print(json.dumps({"benchmark": "lm_grid", "data": args.data, "files": len(files),
                      "shipped": {"lm_weight": beam.LM_WEIGHT, "word_bonus": beam.WORD_BONUS,
                                  "beam_width": beam.BEAM_WIDTH},
                      "grid": sorted(grid, key=lambda row: row["mean_wer"])}))


if __name__ == "__main__":
    main()
