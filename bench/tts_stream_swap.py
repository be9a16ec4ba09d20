"""Which predicted feature stream costs the TTS student its intelligibility? Swap one at a time.

    python -m bench.tts_stream_swap --texts bench/tts_heldout.txt --limit 40 --json
    python -m bench.tts_stream_swap --texts bench/tts_train_lines.txt --json   # lines it trained on

For each line, Piper joe (the teacher) speaks it with alignments and WORLD analyses the
audio (engine/train/tts_data.py), and the student predicts features on the teacher's own
durations, as in training. Each system below goes through engine/vocoder.py and the same
judge as bench/tts_vocoder_ceiling.py (Whisper tiny.en, STT scoring normaliser):

- teacher: the teacher's features (the vocoder's ceiling on these lines);
- student: the student's, on the teacher's durations;
- student+teacher_f0v / _env / _ap: the student's with one stream (log f0 and voicing, the
  spectral envelope, the aperiodicity) replaced by the teacher's;
- own_durations: the student's features on its own predicted durations, the whole line at once;
  own_durations_x1.1: those durations stretched by 10 %.

Also reported: own_over_teacher_frames_median, the student's total frames over the teacher's.
Needs the training extras (`make train-setup`: piper-tts, pyworld, faster-whisper).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bench.tts_vocoder_ceiling import torch_hn
from engine import text as frontend, vocoder
from engine.bench import whisper_judge
from engine.wer import normalize_for_wer
from engine.train.tts_data import analyse, load_teacher, teacher_utterance
from engine.tts import TtsModel, load_model, round_durations
from engine.wer import word_error_rate

ENVELOPE = slice(2, 2 + vocoder.N_BANDS)
APERIODICITY = slice(2 + vocoder.N_BANDS, None)
STRETCH = 1.1


def predict(model: TtsModel, ids: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the model's own frames per id, its features on the given durations)."""
    with torch.no_grad():
        log_durations, outputs = model(torch.from_numpy(ids)[None], torch.from_numpy(durations)[None])
        return round_durations(log_durations[0]).numpy(), model.denormalise(outputs)[0].numpy()


def swapped(student: np.ndarray, teacher: np.ndarray) -> dict[str, np.ndarray]:
    """The student's features with one stream at a time from the teacher (same frame count)."""
    systems = {"teacher": teacher, "student": student}
    for name, columns in (("f0v", slice(0, 2)), ("env", ENVELOPE), ("ap", APERIODICITY)):
        mixed = student.copy()
        mixed[:, columns] = teacher[:, columns]
        systems[f"student+teacher_{name}"] = mixed
    return systems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", default="bench/tts_heldout.txt")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--weights", default="", help="TTS weights (default: shipped)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [ln.strip() for ln in Path(args.texts).read_text(encoding="utf-8").splitlines() if ln.strip()]
    model = load_model(Path(args.weights) if args.weights else None).eval()
    teacher_voice, judge = load_teacher(), whisper_judge("tiny.en")
    refs, hyps, frame_ratios = [], {}, []
    for line in lines[: args.limit]:
        audio, ids, durations = teacher_utterance(teacher_voice, frontend.normalize_text(line))
        teacher = analyse(audio[: len(audio) // vocoder.HOP * vocoder.HOP])
        own, student = predict(model, ids, durations)
        frames = min(len(student), len(teacher))
        systems = swapped(student[:frames].copy(), teacher[:frames])
        frame_ratios.append(own.sum() / max(1, durations.sum()))
        systems["own_durations"] = predict(model, ids, own)[1]
        stretched = np.maximum(np.round(own * STRETCH), own > 0).astype(np.int64)
        systems["own_durations_x1.1"] = predict(model, ids, stretched)[1]
        refs.append(normalize_for_wer(line))
        for name, features in systems.items():
            heard = judge(torch_hn(features.astype(np.float32)), vocoder.SAMPLE_RATE)
            hyps.setdefault(name, []).append(normalize_for_wer(heard))
    result = {name: round(word_error_rate(refs, said), 4) for name, said in hyps.items()}
    result.update(own_over_teacher_frames_median=round(float(np.median(frame_ratios)), 4), n=len(refs),
                  texts=args.texts, judge="whisper tiny.en int8 beam 5")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
