"""Retrain only the end-of-turn head of a trained STT model, its encoder frozen.

    python -m engine.train.retrain_eot_head --weights_path=runs/stt/ckpt.pt   # -> runs/stt-head/stt.safetensors
    python -m engine.train.retrain_eot_head --weights_path=runs/stt/ckpt.pt --export=1   # and ship it
    python -m engine.train.retrain_eot_head --weights_path=runs/stt-ft/best.pt --teacher=engine/weights/stt.safetensors

The head is one linear layer (3 x 257 weights) over the encoder's output. Retrained on cached
encoder outputs it takes minutes on a CPU where the whole model takes hours, and it changes
no transcript: the encoder and the CTC head stay as they are. A checkpoint whose encoder
already separates speech from noise gets a head that (a) is sure of speech within a few
tens of milliseconds of a word, so a barge-in can pause on it, but never on line noise,
tones or echo residue, and (b) says "end of turn" after short complete answers.

Examples come from the training stream (stt_data.SttDataset: augmented speech with its
per-frame labels, line noise, echo residue), 1-4 joined into one stream, so the head also
learns from the long-running state of a call.

After a fine-tune of the encoder (new voices), `teacher` aims to keep the turn-taking the
product was tuned on: the new head learns the teacher model's end-of-turn probabilities on
the same audio (`teacher_weight` of the loss; the rest is the labels), instead of finding
its own trade-off between early and late turn ends (how far that got: STT model card,
"Checkpoints not shipped"). An export must pass the same guard as
train_stt's (no turn on non-speech) and may not lose held-out WER.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from engine import weights
from engine.audio import log_mel, stack_frames
from engine.stt import SttModel, load_model
from engine.train.checkpoints import apply_overrides
from engine.train.stt_data import EOT_FRAME, SttDataset
from engine.train.train_stt import SHIPPED, end_of_turn_loss, evaluate_folders, hears_non_speech, selection_wer

# -- configuration ----------------------------------------------------------------------------
weights_path = "runs/stt/ckpt.pt"  # the trained model whose encoder is kept
out = "runs/stt-head/stt.safetensors"
shard_dirs = "data/stt,data/stt-short"
eval_dirs = "data/stt-eval"
eval_files = 40
streams = 500  # joined examples whose encoder outputs train the head (~2 h of audio)
non_speech_share = 0.15  # line noise and tones: more than in training, the head must never fire on them
echo_residue_share = 0.1
seed = 3
epochs = 8
learning_rate = 3e-3
class_weights = (1.0, 1.0, 6.0)  # speech, pause, end: turn ends are rare and must be sure
teacher = ""  # a model whose end-of-turn probabilities the new head learns (e.g. the shipped weights)
teacher_weight = 1.0  # share of the loss that follows the teacher; the rest follows the labels
export = 0
# ---------------------------------------------------------------------------------------------

SETTINGS = {k: v for k, v in dict(globals()).items() if not k.startswith("_") and isinstance(v, (int, float, str, tuple))
            and k not in ("SHIPPED", "EOT_FRAME")}


@torch.no_grad()
def encoder_output(model: SttModel, audio: np.ndarray) -> torch.Tensor:
    """float 16 kHz audio -> the encoder's output per 40 ms frame [T, width]."""
    hidden, _ = model.encode(stack_frames(log_mel(torch.from_numpy(audio.astype(np.float32))))[None])
    return hidden[0]


def whole_frames(audio: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Audio cut or padded (with its own tail, mirrored) to exactly one label per 40 ms, so
    joined examples keep their labels on the frames they describe."""
    n = len(labels) * EOT_FRAME
    if len(audio) < n:
        audio = np.concatenate([audio, audio[::-1][: n - len(audio)]])
    return audio[:n]


def collect(model: SttModel, cfg: dict, teacher: Optional[SttModel] = None
            ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Encoder outputs, labels and (with a teacher) the teacher's P(speech, pause, end) per frame."""
    examples = iter(SttDataset(cfg["shard_dirs"].split(","), seed=cfg["seed"], non_speech_share=cfg["non_speech_share"],
                               echo_residue_share=cfg["echo_residue_share"]))
    rng = np.random.default_rng(cfg["seed"])
    hidden, labels, taught = [], [], []
    for k in range(cfg["streams"]):
        joined = [next(examples) for _ in range(int(rng.integers(1, 5)))]
        audio = np.concatenate([whole_frames(e["audio"], e["eot"]) for e in joined])
        eot = np.concatenate([e["eot"] for e in joined])
        h = encoder_output(model, audio)
        n = min(len(h), len(eot))
        hidden.append(h[:n])
        labels.append(torch.from_numpy(eot[:n].astype(np.int64)))
        if teacher is not None:
            with torch.no_grad():
                taught.append(teacher.eot_head(encoder_output(teacher, audio)[:n]).softmax(-1))
        if k % 100 == 0:
            print(f"stream {k}/{cfg['streams']}", flush=True)
    return torch.cat(hidden), torch.cat(labels), torch.cat(taught) if taught else None


def freeze_all_but_head(model: SttModel) -> SttModel:
    model.requires_grad_(False)
    model.eot_head.requires_grad_(True)
    return model


def train_head(model: SttModel, hidden: Tensor, labels: Tensor, taught: Optional[Tensor], cfg: dict) -> None:
    head = model.eot_head
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg["learning_rate"], weight_decay=0.0)
    class_weights = torch.tensor(cfg["class_weights"], dtype=torch.float32)
    generator = torch.Generator().manual_seed(cfg["seed"])
    for epoch in range(cfg["epochs"]):
        total = 0.0
        for idx in torch.randperm(len(labels), generator=generator).split(4096):
            loss = end_of_turn_loss(head(hidden[idx]), labels[idx], class_weights,
                                    None if taught is None else taught[idx], cfg["teacher_weight"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        with torch.no_grad():
            predicted = head(hidden).argmax(-1)
            recall = [round(float((predicted[labels == c] == c).float().mean()), 3) for c in range(3)]
        print(f"epoch {epoch}: loss {total / len(labels):.4f}, recall speech/pause/end {recall}", flush=True)


def main(argv: list[str]) -> None:
    cfg = apply_overrides(SETTINGS, argv)
    torch.manual_seed(cfg["seed"])
    started = time.time()
    model = freeze_all_but_head(load_model(Path(cfg["weights_path"])).float())
    teacher = load_model(Path(cfg["teacher"])).float().eval() if cfg["teacher"] else None
    hidden, labels, taught = collect(model, cfg, teacher)
    train_head(model, hidden, labels, taught, cfg)
    model.eval()
    heard = hears_non_speech(model)
    if heard:
        raise SystemExit(f"not saved: the model starts a turn on {', '.join(heard)}")
    wer = selection_wer(evaluate_folders(model, cfg))
    info = {"held_out_wer": wer, "encoder": cfg["weights_path"], "eot_head": "retrained on a frozen encoder "
            f"({cfg['streams']} streams, seed {cfg['seed']}, {len(labels)} frames"
            + (f", taught by {cfg['teacher']} at weight {cfg['teacher_weight']}" if teacher is not None else "") + ")"}
    source = torch.load(cfg["weights_path"], map_location="cpu", weights_only=False) \
        if cfg["weights_path"].endswith(".pt") else {}
    if "step" in source:
        info["step"] = source["step"]
    target = SHIPPED if cfg["export"] else Path(cfg["out"])
    if cfg["export"] and SHIPPED.exists():
        old = selection_wer(evaluate_folders(load_model(SHIPPED), cfg))
        if not wer < old:
            raise SystemExit(f"not exported: held-out WER {wer:.3f} does not beat the shipped {old:.3f}")
    weights.save(model, model.config_dict(), target, info)
    print(f"wrote {target} (held-out WER {wer:.3f}) in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
