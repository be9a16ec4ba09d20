"""Train Parley's streaming STT model (engine/stt.py): CTC characters + end-of-turn head.

    # the long run, in the background (resumes from out_dir/ckpt.pt after any stop):
    nohup nice -n 5 .venv/bin/python -m engine.train.train_stt > runs/stt.out 2>&1 &
    # any setting below can be overridden:
    python -m engine.train.train_stt --max_steps=50 --out_dir=runs/stt-smoke --width=64
    # real recordings (wav+txt folders or a LibriSpeech tree), e.g. on a GPU:
    python -m engine.train.train_stt --real_dirs=/data/LibriSpeech/train-clean-100 --device=cuda
    # fine-tune the shipped weights on new shards (fresh optimizer, the config read from the file):
    python -m engine.train.train_stt --init_from=engine/weights/stt.safetensors --out_dir=runs/stt-ft --learning_rate=3e-4
    #   ... keeping the shipped model's turn ends (its end-of-turn probabilities as soft targets):
    #   --eot_teacher=engine/weights/stt.safetensors --eot_teacher_weight=0.8
    # ship the best checkpoint (only if it beats the shipped weights on the held-out voices):
    python -m engine.train.train_stt --export=1

Progress goes to out_dir/train.log as JSON lines; every eval_every steps the model
transcribes the held-out folders (voices and sentences never trained on) and the best
selection WER is kept as out_dir/best.pt. The blind voices (BLIND_FOLDERS) are transcribed
and logged but never count towards a choice: not the best checkpoint, not the export.
An export must also stay silent on non-speech (digital silence, faint noise).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from engine import weights
from engine.audio import FRAMES_PER_STEP, HOP_LENGTH, N_FFT, SAMPLE_RATE, log_mel, stack_frames
from engine.stt import SttConfig, SttModel, encode_text, load_model, transcribe
from engine.train.checkpoints import apply_overrides, log, save_checkpoint
from engine.wer import normalize_for_wer
from engine.wer import word_error_rate

# -- configuration ----------------------------------------------------------------------------
out_dir = "runs/stt"
shard_dirs = "data/stt,data/stt-short"  # comma-separated folders of synthesized shards (short: synth --corpus short)
real_dirs = ""  # comma-separated folders of real recordings
eval_dirs = "data/stt-eval"  # each subfolder: one held-out voice group (NAME.wav + NAME.txt)
eval_files = 40  # per held-out folder, per evaluation
# model
width = 256
depth = 6
expand = 1
mlp_ratio = 2
# optimisation
batch_seconds = 160.0  # audio per batch
bucket_batches = 8  # examples for this many batches are sorted by length to limit padding
learning_rate = 2e-3
min_lr = 1e-4
warmup_steps = 300
max_steps = 30000
weight_decay = 0.05
grad_clip = 1.0
eot_weight = 0.5  # end-of-turn cross-entropy relative to CTC
eot_class_weights = (1.0, 1.0, 3.0)  # speech, pause, end: turn ends are the rare class
call_context_share = 0.0  # examples heard as a call's later turn, after an earlier one and a reply (stt_data)
non_speech_share = 0.05  # examples of line noise and tones alone, empty transcript (stt_data.NON_SPEECH_SHARE)
# bookkeeping
log_every = 10
checkpoint_every = 100
eval_every = 500
reset_best = 0  # 1: forget the resumed checkpoint's best WER (after the held-out folders changed)
seed = 1337
device = "auto"
init_from = ""  # a .safetensors or .pt to start from (its size wins over width/depth/...); a resume reads its own ckpt.pt
eot_teacher = ""  # a fine-tune keeps this model's end-of-turn probabilities (e.g. the shipped weights) ...
eot_teacher_weight = 0.0  # ... as this share of the end-of-turn loss; the rest follows the labels
threads = 2
data_workers = 1
export = 0
# ---------------------------------------------------------------------------------------------

SHIPPED = weights.WEIGHTS_DIR / "stt.safetensors"
SETTINGS = {k: v for k, v in dict(globals()).items() if not k.startswith("_") and isinstance(v, (int, float, str, tuple))
            and k not in ("SHIPPED", "SAMPLE_RATE", "HOP_LENGTH", "N_FFT", "FRAMES_PER_STEP")}


def model_frames(n_samples: int) -> int:
    """40 ms model frames produced from n_samples of audio."""
    mel_frames = 0 if n_samples < N_FFT else 1 + (n_samples - N_FFT) // HOP_LENGTH
    return mel_frames // FRAMES_PER_STEP


def keep_numpy(example: dict) -> dict:
    """The DataLoader would turn arrays into tensors; the batching below wants numpy."""
    return example


def batches(dataset, cfg: dict):
    """Length-bucketed batches of about batch_seconds of audio each."""
    stream = iter(dataset)
    while True:
        pool, seconds = [], 0.0
        while seconds < cfg["batch_seconds"] * cfg["bucket_batches"]:
            example = next(stream)
            # An empty transcript is a lesson too (noise, echo residue: write nothing), but a
            # text with no character the model can write would teach it to drop words.
            if (encode_text(example["text"]) or not example["text"]) and model_frames(len(example["audio"])) > 0:
                pool.append(example)
                seconds += len(example["audio"]) / SAMPLE_RATE
        pool.sort(key=lambda e: len(e["audio"]))
        batch, seconds, out = [], 0.0, []
        for example in pool:
            batch.append(example)
            seconds += len(example["audio"]) / SAMPLE_RATE
            if seconds >= cfg["batch_seconds"]:
                out.append(batch)
                batch, seconds = [], 0.0
        if batch:
            out.append(batch)
        np.random.default_rng().shuffle(out)
        yield from out


def collate(batch: list[dict], dev: torch.device):
    """Features, CTC targets and end-of-turn labels for one batch, on `dev`."""
    longest = max(len(e["audio"]) for e in batch)
    audio = torch.zeros(len(batch), longest)
    for i, e in enumerate(batch):
        audio[i, : len(e["audio"])] = torch.from_numpy(e["audio"])
    features = stack_frames(log_mel(audio.to(dev)))
    frames = torch.tensor([model_frames(len(e["audio"])) for e in batch])
    targets = [torch.tensor(encode_text(e["text"])) for e in batch]
    eot = torch.full((len(batch), features.shape[1]), -100, dtype=torch.long)
    for i, e in enumerate(batch):
        n = min(int(frames[i]), len(e["eot"]))
        eot[i, :n] = torch.from_numpy(e["eot"][:n].astype(np.int64))
    return features, frames, torch.cat(targets), torch.tensor([len(t) for t in targets]), eot.to(dev)


def end_of_turn_loss(logits: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor,
                     taught: Optional[torch.Tensor] = None, teacher_weight: float = 0.0) -> torch.Tensor:
    """Cross-entropy of end-of-turn logits [N, 3] against labels [N] (-100: no label); with a
    teacher's probabilities [N, 3], blended with the soft cross-entropy against them on the
    labelled frames (teacher_weight of the loss)."""
    logits = logits.float()
    loss = F.cross_entropy(logits, labels, weight=class_weights, ignore_index=-100)
    if taught is None:
        return loss
    labelled = labels != -100
    distilled = -(taught[labelled] * logits[labelled].log_softmax(-1)).sum(-1).mean()
    return (1.0 - teacher_weight) * loss + teacher_weight * distilled


def losses(model: SttModel, batch, cfg: dict, teacher: Optional[SttModel] = None):
    """CTC and end-of-turn losses; with a teacher, the end-of-turn loss also keeps its
    probabilities, so a fine-tune on new voices does not relearn when turns end."""
    features, frames, targets, target_lengths, eot = batch
    ctc_logits, eot_logits, _ = model(features)
    log_probs = ctc_logits.float().log_softmax(-1).transpose(0, 1)  # [T, B, V]
    ctc = F.ctc_loss(log_probs, targets, frames, target_lengths, blank=0, reduction="mean", zero_infinity=True)
    class_weights = torch.tensor(cfg["eot_class_weights"], device=eot_logits.device)
    taught = None
    if teacher is not None:
        with torch.no_grad():
            taught = teacher(features)[1].float().softmax(-1).reshape(-1, 3)
    eot_loss = end_of_turn_loss(eot_logits.reshape(-1, 3), eot.reshape(-1), class_weights, taught,
                                cfg["eot_teacher_weight"])
    return ctc, eot_loss


def learning_rate_at(step: int, cfg: dict) -> float:
    if step < cfg["warmup_steps"]:
        return cfg["learning_rate"] * (step + 1) / cfg["warmup_steps"]
    progress = min(1.0, (step - cfg["warmup_steps"]) / max(1, cfg["max_steps"] - cfg["warmup_steps"]))
    return cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg["learning_rate"] - cfg["min_lr"])


BLIND_FOLDERS = ("kokoro_jf_nezumi", "kokoro_jf_tebukuro")  # reported, never used to select


def selection_wer(results: dict[str, float]) -> float:
    """Mean WER over the held-out folders that may guide choices (not the blind voices)."""
    chosen = [wer for name, wer in results.items() if name not in BLIND_FOLDERS]
    return float(np.mean(chosen)) if chosen else float("nan")


@torch.no_grad()
def hears_non_speech(model: SttModel) -> list[str]:
    """Names of the non-speech signals on which the model starts a turn (it must not)."""
    from engine.interface import SpeechStart
    from engine.stt import Recognizer

    signals = {"digital silence": np.zeros(5 * SAMPLE_RATE, np.int16),
               "faint noise": np.random.default_rng(0).normal(0, 30, 5 * SAMPLE_RATE).astype(np.int16),
               "a full-scale buzz": np.tile(np.r_[np.full(40, 32767), np.full(40, -32768)], 1000).astype(np.int16)}
    heard = []
    for name, audio in signals.items():
        for precision in ("float", "auto"):  # the exact model (GPU), and how a CPU steps it (int8)
            recognizer = Recognizer(model, lm=None, precision=precision)
            events = [e for start in range(0, len(audio), 320) for e in recognizer.push(audio[start:start + 320])]
            if any(isinstance(e, SpeechStart) for e in events):
                heard.append(name)
                break
    return heard


def held_out_folders(cfg: dict) -> list[Path]:
    root = Path(cfg["eval_dirs"])
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _read_wav(path: Path) -> np.ndarray:
    from engine.wavfile import read_wav

    return read_wav(path, SAMPLE_RATE)


@torch.no_grad()
def evaluate_folders(model: SttModel, cfg: dict) -> dict[str, float]:
    """Greedy WER per held-out folder (its first eval_files files, sorted, so runs compare)."""
    model.eval()
    results = {}
    for folder in held_out_folders(cfg):
        refs, hyps = [], []
        for wav_path in sorted(folder.glob("*.wav"))[: cfg["eval_files"]]:
            txt = wav_path.with_suffix(".txt")
            if txt.exists():
                refs.append(normalize_for_wer(txt.read_text()))
                hyps.append(normalize_for_wer(transcribe(model, _read_wav(wav_path), lm=None)))  # acoustic only
        if refs:
            results[folder.name] = round(word_error_rate(refs, hyps), 4)
    model.train()
    return results


def new_model(cfg: dict) -> SttModel:
    """Random weights of the configured size, or init_from's weights and size."""
    if cfg["init_from"]:
        return load_model(Path(cfg["init_from"]))
    return SttModel(SttConfig(cfg["width"], cfg["depth"], cfg["expand"], cfg["mlp_ratio"]))


def export_best(cfg: dict) -> None:
    """Copy best.pt to engine/weights/stt.safetensors if its held-out WER beats the shipped one."""
    best = torch.load(Path(cfg["out_dir"]) / "best.pt", map_location="cpu", weights_only=False)
    model = SttModel(SttConfig(**best["model_config"]))
    model.load_state_dict(best["model"])
    heard = hears_non_speech(model.eval())
    if heard:
        raise SystemExit(f"not exported: the model starts a turn on {', '.join(heard)}")
    new_wer = selection_wer(evaluate_folders(model, cfg))
    if SHIPPED.exists():
        shipped = load_model(SHIPPED)
        old_wer = selection_wer(evaluate_folders(shipped, cfg))
        if not new_wer < old_wer:
            raise SystemExit(f"not exported: held-out WER {new_wer:.3f} does not beat the shipped {old_wer:.3f}")
    weights.save(model, best["model_config"], SHIPPED, {"step": best["step"], "held_out_wer": new_wer})
    print(f"exported {SHIPPED} (held-out WER {new_wer:.3f})")


def main(argv: list[str]) -> None:
    cfg = apply_overrides(SETTINGS, argv)
    if cfg["export"]:
        return export_best(cfg)
    from engine.train.stt_data import SttDataset

    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(cfg["threads"])
    dev = torch.device("cuda" if cfg["device"] == "auto" and torch.cuda.is_available()
                       else ("cpu" if cfg["device"] == "auto" else cfg["device"]))
    step, best = 0, float("inf")
    checkpoint = out / "ckpt.pt"
    # A resumed run takes its size from its own checkpoint, never from init_from or the settings.
    state = torch.load(checkpoint, map_location=dev, weights_only=False) if checkpoint.exists() else None
    model = (SttModel(SttConfig(**state["model_config"])) if state else new_model(cfg)).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=cfg["weight_decay"])
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, best = state["step"], (float("inf") if cfg["reset_best"] else state["best_wer"])
        log(out, {"event": "resumed", "step": step, "best_wer": best})
    else:
        params = sum(p.numel() for p in model.parameters())
        log(out, {"event": "start", "parameters": params, "device": str(dev), "init_from": cfg["init_from"],
                  "settings": cfg})

    teacher = load_model(Path(cfg["eot_teacher"])).to(dev).eval() if cfg["eot_teacher"] else None
    dataset = SttDataset(cfg["shard_dirs"].split(","), real=[d for d in cfg["real_dirs"].split(",") if d],
                         seed=cfg["seed"] + step, call_context_share=cfg["call_context_share"],
                         non_speech_share=cfg["non_speech_share"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=cfg["data_workers"],
                                         collate_fn=keep_numpy)
    started, audio_seconds = time.time(), 0.0
    model.train()
    for batch in batches(loader, cfg):
        if step >= cfg["max_steps"]:
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, cfg)
        tensors = collate(batch, dev)
        ctc, eot_loss = losses(model, tensors, cfg, teacher)
        loss = ctc + cfg["eot_weight"] * eot_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        step += 1
        audio_seconds += sum(len(e["audio"]) for e in batch) / SAMPLE_RATE
        if step % cfg["log_every"] == 0:
            elapsed = time.time() - started
            log(out, {"step": step, "ctc": round(ctc.item(), 4), "eot": round(eot_loss.item(), 4),
                      "grad_norm": round(float(grad_norm), 3), "lr": round(learning_rate_at(step, cfg), 6),
                      "audio_s_per_s": round(audio_seconds / elapsed, 1)})
        if step % cfg["eval_every"] == 0:
            results = evaluate_folders(model, cfg)
            mean = selection_wer(results)
            log(out, {"step": step, "held_out_wer": results, "selection_wer": round(mean, 4)})
            if results and mean < best:
                best = mean
                save_checkpoint(out / "best.pt", model, optimizer, step, best, cfg)
        if step % cfg["checkpoint_every"] == 0:
            save_checkpoint(checkpoint, model, optimizer, step, best, cfg)
    save_checkpoint(checkpoint, model, optimizer, step, best, cfg)
    log(out, {"event": "stopped", "step": step, "best_wer": best})


if __name__ == "__main__":
    main(sys.argv[1:])
