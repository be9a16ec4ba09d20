"""STT WER split by kind of text: prose (general English) against contact-center turns.

    python -m bench.stt_by_text --data data/stt-eval-120/kokoro_mix_heldout data/stt-eval-120/flite_slt --json

A file is "prose" when its normalized transcript is one of the prose sentences: by default the
general-English part of the training corpus (`engine.train.corpus.general_sentences`, Debian's
`fortunes`; `make train-setup`), or the lines of --prose FILE. Everything else is "dialogue".
Each file goes through the model once (offline, float, as the trainer evaluates) and is read
twice: greedy CTC (the acoustic model alone) and the beam search with the shipped LM. The split
shows where the errors are: the LM knows the contact-center phrasing, so its gain there hides
how little of open English the acoustic model can spell.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from engine import stt
from engine.bench import pairs
from engine.textnorm import normalize
from engine.wer import normalize_for_wer
from engine.wavfile import read_wav
from engine.wer import word_error_rate

KINDS = ("prose", "dialogue")


def prose_sentences(path: str | None) -> set[str]:
    if path:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    else:
        from engine.train.corpus import general_sentences
        lines = general_sentences()
    return {normalize_for_wer(normalize(line)) for line in lines if line.strip()}


def score(refs: list[str], greedy: list[str], with_lm: list[str]) -> dict:
    return {"n": len(refs), "words": sum(len(ref.split()) for ref in refs),
            "wer_greedy": round(word_error_rate(refs, greedy), 4), "wer_lm": round(word_error_rate(refs, with_lm), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", required=True, help="folders of NAME.wav + NAME.txt")
    parser.add_argument("--weights", help="STT weights (default: shipped)")
    parser.add_argument("--prose", help="file of prose sentences, one per line (default: the training corpus')")
    parser.add_argument("--limit", type=int, default=0, help="files per folder (0: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prose = prose_sentences(args.prose)
    model = stt.load_model(Path(args.weights) if args.weights else None)
    lm = stt.resolve_lm(stt.SHIPPED)
    folders, pooled = {}, {kind: ([], [], []) for kind in KINDS}
    for folder in args.data:
        rows = {kind: ([], [], []) for kind in KINDS}
        for wav, text in pairs(Path(folder))[: args.limit or None]:
            ref = normalize_for_wer(text)
            logits = stt.offline_ctc_logits(model, read_wav(wav, stt.SAMPLE_RATE))  # eval mode, no autograd
            kind = "prose" if ref in prose else "dialogue"
            readings = (ref, normalize_for_wer(stt.decode_offline(logits, None)),
                        normalize_for_wer(stt.decode_offline(logits, lm)))
            for columns in (rows[kind], pooled[kind]):
                for column, reading in zip(columns, readings):
                    column.append(reading)
        folders[Path(folder).name] = {kind: score(*columns) for kind, columns in rows.items() if columns[0]}
    print(json.dumps({"benchmark": "stt_by_text", "weights": args.weights or "shipped",
                      "prose_sentences": len(prose), "folders": folders,
                      "all": {kind: score(*columns) for kind, columns in pooled.items() if columns[0]}}))


if __name__ == "__main__":
    main()
