"""Distil Piper joe's text encoder into Parley's streaming TTS encoder (engine/tts.py).

    # the targets first (engine/train/prior_data.py), then, in the background (resumes from
    # out_dir/ckpt.pt after any stop):
    nohup nice -n 5 .venv/bin/python -m engine.train.train_tts > runs/tts/train.out 2>&1 &
    # any setting below can be overridden:
    python -m engine.train.train_tts --max_steps=20 --out_dir=runs/tts-smoke --width=64 --eval_every=10
    # ship the best checkpoint (only if it beats the shipped weights on the held-out texts):
    python -m engine.train.train_tts --export=1

The student reads phoneme ids causally with LOOKAHEAD ids of lookahead and predicts, per id,
what Piper's encoder (a transformer over the whole sentence) gives its flow: the prior mean
m_p (MSE on per-channel normalised values) and the frames per id (MSE on log(1 + frames)).
Both are per id, not per frame, so a step is cheap: no audio is made in training. Piper's own
flow and decoder render the result (engine/piper.py). Every eval_every steps the model speaks
eval_texts held-out texts (tts_texts.heldout_written, never bench/tts_heldout.txt) and
Whisper tiny.en transcribes them; the best WER is kept as out_dir/best.pt. Progress:
out_dir/train.log, JSON lines.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from engine import weights
from engine.tts import END_ID, SAMPLE_RATE, TtsConfig, TtsModel, synthesize_whole
from engine.train.checkpoints import apply_overrides, log, save_checkpoint
from engine.wer import normalize_for_wer, word_error_rate

# -- configuration ----------------------------------------------------------------------------
out_dir = "runs/tts"
shard_dir = "data/tts-prior"
eval_texts = 24
# model
width = 192
encoder_depth = 3
mlp_ratio = 2
lookahead = 6
# optimisation
batch_ids = 6000  # ids per batch (~40 utterances)
learning_rate = 1e-3
min_lr = 5e-5
warmup_steps = 100
max_steps = 6000
weight_decay = 0.01
grad_clip = 1.0
duration_weight = 1.0
# bookkeeping
log_every = 20
checkpoint_every = 100
eval_every = 500
reload_every = 250
seed = 1337
threads = 1
export = 0
export_from = "best.pt"  # the checkpoint in out_dir that --export=1 ships
init_from = ""  # a .safetensors or .pt whose encoder and duration head start the student
# ---------------------------------------------------------------------------------------------

SHIPPED = weights.WEIGHTS_DIR / "tts.safetensors"
SETTINGS = {k: v for k, v in dict(globals()).items() if not k.startswith("_") and isinstance(v, (int, float, str))
            and k not in ("SHIPPED", "END_ID", "SAMPLE_RATE")}


def load_shards(folder: str) -> list[dict]:
    from engine.train.prior_data import read_shard

    return [item for path in sorted(Path(folder).glob("shard_*.npz")) for item in read_shard(path)]


def prior_stats(items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    priors = np.concatenate([i["prior"] for i in items]).astype(np.float32)
    return torch.from_numpy(priors.mean(0)), torch.from_numpy(priors.std(0) + 1e-3)


def batches(items: list[dict], cfg: dict, rng: random.Random):
    """Batches of similar-length utterances, about batch_ids ids each, in random order."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]["ids"]) + rng.random() * 20)
    groups, current, size = [], [], 0
    for i in order:
        current.append(items[i])
        size = len(items[i]["ids"]) * len(current)
        if size >= cfg["batch_ids"]:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    rng.shuffle(groups)
    yield from groups


def collate(batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(i["ids"]) for i in batch)
    ids = torch.full((len(batch), length), END_ID, dtype=torch.long)
    durations = torch.zeros(len(batch), length)
    priors = torch.zeros(len(batch), length, batch[0]["prior"].shape[1])
    for row, item in enumerate(batch):
        n = len(item["ids"])
        ids[row, :n] = torch.from_numpy(item["ids"])
        durations[row, :n] = torch.from_numpy(item["durations"].astype(np.float32))
        priors[row, :n] = torch.from_numpy(item["prior"].astype(np.float32))
    return ids, durations, priors


def losses(model: TtsModel, tensors, cfg: dict) -> dict[str, torch.Tensor]:
    ids, durations, priors = tensors
    log_durations, predicted = model(ids)
    mask = (ids != END_ID).float()
    target = (priors - model.prior_mean) / model.prior_std
    prior = (((predicted - target) ** 2).mean(-1) * mask).sum() / mask.sum()
    duration = (((log_durations - torch.log1p(durations)) ** 2) * mask).sum() / mask.sum()
    return {"loss": prior + cfg["duration_weight"] * duration, "prior": prior, "duration": duration}


def learning_rate_at(step: int, cfg: dict) -> float:
    if step < cfg["warmup_steps"]:
        return cfg["learning_rate"] * (step + 1) / cfg["warmup_steps"]
    progress = min(1.0, (step - cfg["warmup_steps"]) / max(1, cfg["max_steps"] - cfg["warmup_steps"]))
    return cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg["learning_rate"] - cfg["min_lr"])


_JUDGE = None


def judge(audio: np.ndarray) -> str:
    """Whisper tiny.en (engine.bench's judge) on 22.05 kHz float audio."""
    global _JUDGE
    if _JUDGE is None:
        from engine.bench import whisper_judge

        _JUDGE = whisper_judge("tiny.en")
    return _JUDGE(audio, SAMPLE_RATE)


@torch.no_grad()
def evaluate(model: TtsModel, cfg: dict) -> float:
    """Whisper WER of the model speaking eval_texts held-out texts (whole-utterance path)."""
    from engine.text import normalize_text, phonemize
    from engine.train.tts_texts import heldout_written

    model.eval()
    refs, hyps = [], []
    for text in heldout_written(cfg["eval_texts"]):
        phrase, _ = phonemize(normalize_text(text))
        refs.append(normalize_for_wer(text))
        hyps.append(normalize_for_wer(judge(synthesize_whole(model, phrase.ids))))
    model.train()
    return word_error_rate(refs, hyps) if refs else float("nan")


def load_checkpoint_model(path: Path) -> tuple[TtsModel, dict]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    model = TtsModel(TtsConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model, checkpoint


def export_best(cfg: dict) -> None:
    """Write export_from to engine/weights/tts.safetensors if its held-out WER beats the shipped one."""
    model, best = load_checkpoint_model(Path(cfg["out_dir"]) / cfg["export_from"])
    new_wer = evaluate(model, cfg)
    if SHIPPED.exists():
        try:
            from engine.tts import load_model

            old_wer = evaluate(load_model(SHIPPED), cfg)
        except (RuntimeError, TypeError):  # a shipped file of another architecture: the new one replaces it
            old_wer = float("inf")
        if new_wer >= old_wer:
            raise SystemExit(f"not exported: held-out WER {new_wer:.3f} does not beat the shipped {old_wer:.3f}")
    weights.save(model, best["model_config"], SHIPPED, {"step": best["step"], "held_out_wer": new_wer,
                                                        "eval_texts": cfg["eval_texts"]})
    print(f"exported {SHIPPED} (held-out WER {new_wer:.3f}, {SHIPPED.stat().st_size / 1e6:.1f} MB)")


def new_model(cfg: dict, items: list[dict]) -> TtsModel:
    """The configured size with the targets' statistics; init_from's encoder, embeddings and
    duration head where given (the prior head always starts fresh)."""
    model = TtsModel(TtsConfig(cfg["width"], cfg["encoder_depth"], cfg["mlp_ratio"], cfg["lookahead"]))
    if cfg["init_from"]:
        path = Path(cfg["init_from"])
        state = (torch.load(path, map_location="cpu", weights_only=False)["model"] if path.suffix == ".pt"
                 else weights.load_state(path))
        own = model.state_dict()
        shared = {k: v for k, v in state.items() if k in own and not k.startswith("prior") and v.shape == own[k].shape}
        model.load_state_dict(shared, strict=False)
    model.prior_mean, model.prior_std = prior_stats(items)
    return model


def main(argv: list[str]) -> None:
    cfg = apply_overrides(SETTINGS, argv)
    torch.set_num_threads(cfg["threads"])
    if cfg["export"]:
        return export_best(cfg)
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    items = load_shards(cfg["shard_dir"])
    if not items:
        raise SystemExit(f"no shards in {cfg['shard_dir']}: run engine.train.prior_data first")
    model = new_model(cfg, items)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=cfg["weight_decay"])
    step, best = 0, float("inf")
    checkpoint = out / "ckpt.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, best = state["step"], state["best_wer"]
        log(out, {"event": "resumed", "step": step, "best_wer": best})
    else:
        log(out, {"event": "start", "parameters": sum(p.numel() for p in model.parameters()), "settings": cfg})
    log(out, {"event": "data", "utterances": len(items), "ids": sum(len(i["ids"]) for i in items)})
    started, ids_seen = time.time(), 0
    model.train()
    while step < cfg["max_steps"]:
        for batch in batches(items, cfg, rng):
            if step >= cfg["max_steps"]:
                break
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(step, cfg)
            parts = losses(model, collate(batch), cfg)
            optimizer.zero_grad(set_to_none=True)
            parts["loss"].backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            optimizer.step()
            step += 1
            ids_seen += sum(len(i["ids"]) for i in batch)
            if step % cfg["log_every"] == 0:
                log(out, {"step": step, **{k: round(v.item(), 4) for k, v in parts.items()},
                          "grad_norm": round(float(grad_norm), 3), "lr": round(learning_rate_at(step, cfg), 6),
                          "ids_per_s": round(ids_seen / (time.time() - started))})
            if step % cfg["checkpoint_every"] == 0:
                save_checkpoint(checkpoint, model, optimizer, step, best, cfg)
            if step % cfg["eval_every"] == 0:
                wer = evaluate(model, cfg)
                log(out, {"step": step, "held_out_wer": round(wer, 4), "eval_texts": cfg["eval_texts"]})
                if wer < best:
                    best = wer
                    save_checkpoint(out / "best.pt", model, optimizer, step, best, cfg)
            if step % cfg["reload_every"] == 0:
                fresh = load_shards(cfg["shard_dir"])
                if len(fresh) > len(items):
                    items = fresh
                    log(out, {"event": "data", "utterances": len(items), "ids": sum(len(i["ids"]) for i in items)})
                break  # re-bucket with the new data
    save_checkpoint(checkpoint, model, optimizer, step, best, cfg)
    log(out, {"event": "stopped", "step": step, "best_wer": best})


if __name__ == "__main__":
    main(sys.argv[1:])
