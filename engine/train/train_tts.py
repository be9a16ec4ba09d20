"""Train Parley's streaming TTS (engine/tts.py) on Piper joe teacher shards (engine/train/tts_data.py).

    # the long run, in the background (resumes from out_dir/ckpt.pt after any stop):
    nohup nice -n 10 .venv/bin/python -m engine.train.train_tts > runs/tts/train.out 2>&1 &
    # any setting below can be overridden:
    python -m engine.train.train_tts --max_steps=20 --out_dir=runs/tts-smoke --width=64 --eval_every=10
    # ship the best checkpoint (only if it beats the shipped weights on the held-out sentences):
    python -m engine.train.train_tts --export=1
    # continue from the shipped weights with a fresh schedule that decays to min_lr:
    python -m engine.train.train_tts --init_from=engine/weights/tts.safetensors --out_dir=runs/tts-anneal \
        --learning_rate=1e-3 --warmup_steps=100 --max_steps=3000 --min_lr=2e-5

Losses: L1 on normalised log-f0 (voiced frames), envelope bands and aperiodicity bands,
BCE on voicing, MSE on log(1 + frames) per id against Piper's exact alignments. Shards are
re-listed every reload_every steps, so data written by a running tts_data job joins in.
Every eval_every steps the model speaks eval_files held-out sentences (predicted durations,
streaming-equivalent parallel path) and Whisper tiny.en transcribes them; the best WER is
kept as out_dir/best.pt. Progress: out_dir/train.log, JSON lines.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine import vocoder, weights
from engine.tts import END_ID, TtsConfig, TtsModel, synthesize_parallel
from engine.train.checkpoints import apply_overrides, log, save_checkpoint
from engine.wer import normalize_for_wer
from engine.wer import word_error_rate

# -- configuration ----------------------------------------------------------------------------
out_dir = "runs/tts"
shard_dir = "data/tts"
eval_dir = "data/tts-eval"  # NAME.txt held-out sentences (+ Piper's NAME.wav)
eval_files = 20
# model
width = 192
encoder_depth = 3
decoder_depth = 4
mlp_ratio = 2
lookahead = 6
# optimisation
batch_frames = 3000  # frames per batch (~35 s of audio)
segment_frames = 0  # 0: whole utterances
learning_rate = 2e-3
min_lr = 1e-4
warmup_steps = 200
max_steps = 20000
weight_decay = 0.01
grad_clip = 1.0
duration_weight = 1.0
voicing_weight = 0.5
# bookkeeping
log_every = 10
checkpoint_every = 50
eval_every = 250
reload_every = 200
seed = 1337
threads = 1
export = 0
export_from = "best.pt"  # the checkpoint in out_dir that --export=1 ships (ckpt.pt: the last step, e.g. after an anneal)
init_from = ""  # a .safetensors or .pt to start from instead of random weights (e.g. to anneal the shipped model)
grow_decoder = 0  # with init_from: append this many decoder blocks, each starting as the identity
# ---------------------------------------------------------------------------------------------

SHIPPED = weights.WEIGHTS_DIR / "tts.safetensors"
SETTINGS = {k: v for k, v in dict(globals()).items() if not k.startswith("_") and isinstance(v, (int, float, str))
            and k not in ("SHIPPED", "END_ID")}


def load_shards(folder: str) -> list[dict]:
    from engine.train.tts_data import read_shard

    items = []
    for path in sorted(Path(folder).glob("shard_*.npz")):
        for item in read_shard(path):
            item.pop("audio")
            items.append(item)
    return items


def feature_stats(items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and std of the vocoder features (log-f0 over voiced frames; voicing kept 0/1)."""
    features = np.concatenate([i["features"] for i in items[:2000]])
    mean, std = features.mean(0), features.std(0) + 1e-3
    voiced = features[:, 1] > 0.5
    mean[0], std[0] = features[voiced, 0].mean(), features[voiced, 0].std() + 1e-3
    mean[1], std[1] = 0.0, 1.0
    return torch.from_numpy(mean), torch.from_numpy(std)


def batches(items: list[dict], cfg: dict, rng: random.Random):
    """Length-sorted buckets of about batch_frames frames, shuffled."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]["features"]) + rng.random() * 50)
    out, batch, frames = [], [], 0
    for i in order:
        batch.append(items[i])
        frames += len(items[i]["features"])
        if frames >= cfg["batch_frames"]:
            out.append(batch)
            batch, frames = [], 0
    if batch:
        out.append(batch)
    rng.shuffle(out)
    return out


def collate(batch: list[dict]):
    longest_ids = max(len(i["ids"]) for i in batch)
    longest_frames = max(len(i["features"]) for i in batch)
    ids = torch.full((len(batch), longest_ids), END_ID, dtype=torch.long)
    durations = torch.zeros(len(batch), longest_ids, dtype=torch.long)
    features = torch.zeros(len(batch), longest_frames, vocoder.N_FEATURES)
    mask = torch.zeros(len(batch), longest_frames)
    for b, item in enumerate(batch):
        n, t = len(item["ids"]), len(item["features"])
        ids[b, :n] = torch.from_numpy(item["ids"])
        durations[b, :n] = torch.from_numpy(item["durations"])
        features[b, :t] = torch.from_numpy(item["features"])
        mask[b, :t] = 1
    return ids, durations, features, mask


def losses(model: TtsModel, tensors, cfg: dict) -> dict[str, torch.Tensor]:
    ids, durations, features, mask = tensors
    log_durations, outputs = model(ids, durations)
    target = (features - model.feature_mean) / model.feature_std
    t = min(outputs.shape[1], target.shape[1])
    outputs, target, mask, features = outputs[:, :t], target[:, :t], mask[:, :t], features[:, :t]
    voiced = features[..., 1] * mask
    denominator = mask.sum().clamp(min=1)
    f0 = ((outputs[..., 0] - target[..., 0]).abs() * voiced).sum() / voiced.sum().clamp(min=1)
    envelope = ((outputs[..., 2:2 + vocoder.N_BANDS] - target[..., 2:2 + vocoder.N_BANDS]).abs().mean(-1) * mask).sum() / denominator
    ap = ((outputs[..., 2 + vocoder.N_BANDS:] - target[..., 2 + vocoder.N_BANDS:]).abs().mean(-1) * mask).sum() / denominator
    voicing = (F.binary_cross_entropy_with_logits(outputs[..., 1], features[..., 1], reduction="none") * mask).sum() / denominator
    id_mask = (ids != END_ID).float()
    duration = (((log_durations - torch.log1p(durations.float())) ** 2) * id_mask).sum() / id_mask.sum()
    total = f0 + envelope + ap + cfg["voicing_weight"] * voicing + cfg["duration_weight"] * duration
    return {"loss": total, "f0": f0, "envelope": envelope, "ap": ap, "voicing": voicing, "duration": duration}


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
    return _JUDGE(audio, vocoder.SAMPLE_RATE)


@torch.no_grad()
def evaluate(model: TtsModel, cfg: dict) -> float:
    """Whisper WER of the model speaking the first eval_files held-out sentences."""
    from engine.text import normalize_text, phonemize

    model.eval()
    refs, hyps = [], []
    for txt in sorted(Path(cfg["eval_dir"]).glob("*.txt"))[: cfg["eval_files"]]:
        text = txt.read_text().strip()
        phrase, _ = phonemize(normalize_text(text))
        audio = synthesize_parallel(model, phrase.ids)
        refs.append(normalize_for_wer(text))
        hyps.append(normalize_for_wer(judge(audio)))
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
        from engine.tts import load_model

        old_wer = evaluate(load_model(SHIPPED), cfg)
        if new_wer >= old_wer:
            raise SystemExit(f"not exported: held-out WER {new_wer:.3f} does not beat the shipped {old_wer:.3f}")
    weights.save(model, best["model_config"], SHIPPED, {"step": best["step"], "held_out_wer": new_wer,
                                                        "eval_files": cfg["eval_files"]})
    print(f"exported {SHIPPED} (held-out WER {new_wer:.3f}, {SHIPPED.stat().st_size / 1e6:.1f} MB)")


def new_model(cfg: dict) -> TtsModel:
    """Random weights of the configured size, or init_from's weights, size and feature
    statistics (grown by grow_decoder blocks)."""
    if cfg["init_from"]:
        from engine.tts import load_model

        return grow_decoder(load_model(Path(cfg["init_from"])), cfg["grow_decoder"])
    if cfg["grow_decoder"]:
        raise SystemExit("grow_decoder needs init_from (a trained model to grow)")
    return TtsModel(TtsConfig(cfg["width"], cfg["encoder_depth"], cfg["decoder_depth"], cfg["mlp_ratio"], cfg["lookahead"]))


def grow_decoder(model: TtsModel, blocks: int) -> TtsModel:
    """The model with `blocks` more decoder blocks after its own. Each new block's output
    projections start at zero, so it passes its input through: the grown model speaks exactly
    as the trained one did, and training adds capacity from there (cheaper than a bigger model
    from scratch)."""
    if blocks < 0:
        raise SystemExit(f"grow_decoder={blocks}: a model can only grow (0 or more blocks)")
    if blocks == 0:
        return model
    depth = model.config.decoder_depth
    grown = TtsModel(replace(model.config, decoder_depth=depth + blocks))
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("decoder.blocks.") for name in missing), (missing, unexpected)
    for block in grown.decoder.blocks[depth:]:
        for projection in (block.out, block.mlp_out):
            torch.nn.init.zeros_(projection.weight)
            torch.nn.init.zeros_(projection.bias)
    return grown.eval()


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
        raise SystemExit(f"no shards in {cfg['shard_dir']}: run engine.train.tts_data first")
    model = new_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=cfg["weight_decay"])
    step, best = 0, float("inf")
    checkpoint = out / "ckpt.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, best = state["step"], state["best_wer"]
        log(out, {"event": "resumed", "step": step, "best_wer": best})
    elif cfg["init_from"]:
        log(out, {"event": "start", "init_from": cfg["init_from"], "settings": cfg})
    else:
        model.feature_mean, model.feature_std = feature_stats(items)
        log(out, {"event": "start", "parameters": sum(p.numel() for p in model.parameters()), "settings": cfg})
    hours = sum(len(i["features"]) for i in items) * vocoder.HOP / vocoder.SAMPLE_RATE / 3600
    log(out, {"event": "data", "utterances": len(items), "hours": round(hours, 3)})
    started, frames_seen = time.time(), 0
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
            frames_seen += sum(len(i["features"]) for i in batch)
            if step % cfg["log_every"] == 0:
                elapsed = time.time() - started
                log(out, {"step": step, **{k: round(v.item(), 4) for k, v in parts.items()},
                          "grad_norm": round(float(grad_norm), 3), "lr": round(learning_rate_at(step, cfg), 6),
                          "audio_s_per_s": round(frames_seen * vocoder.HOP / vocoder.SAMPLE_RATE / elapsed, 2)})
            if step % cfg["checkpoint_every"] == 0:
                save_checkpoint(checkpoint, model, optimizer, step, best, cfg)
            if step % cfg["eval_every"] == 0:
                wer = evaluate(model, cfg)
                log(out, {"step": step, "held_out_wer": round(wer, 4), "eval_files": cfg["eval_files"]})
                if wer < best:
                    best = wer
                    save_checkpoint(out / "best.pt", model, optimizer, step, best, cfg)
            if step % cfg["reload_every"] == 0:
                fresh = load_shards(cfg["shard_dir"])
                if len(fresh) > len(items):
                    items = fresh
                    hours = sum(len(i["features"]) for i in items) * vocoder.HOP / vocoder.SAMPLE_RATE / 3600
                    log(out, {"event": "data", "utterances": len(items), "hours": round(hours, 3)})
                break  # re-bucket with the new data
    save_checkpoint(checkpoint, model, optimizer, step, best, cfg)
    log(out, {"event": "stopped", "step": step, "best_wer": best})


if __name__ == "__main__":
    main(sys.argv[1:])
