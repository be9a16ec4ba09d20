"""What every training recipe here shares: --name=value settings, atomic checkpoints and a
JSON-lines log."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch


def apply_overrides(settings: dict, argv: list[str]) -> dict:
    """--name=value arguments override a recipe's settings (nanoGPT's configurator, minus exec);
    a tuple setting takes comma-separated numbers."""
    config = dict(settings)
    for arg in argv:
        name, _, raw = arg.lstrip("-").partition("=")
        if name not in config:
            raise SystemExit(f"unknown setting {name!r}; settings: {', '.join(sorted(config))}")
        kind = type(config[name])
        config[name] = tuple(float(x) for x in raw.split(",")) if kind is tuple else kind(raw)
    return config


def save_checkpoint(path: Path, model, optimizer, step: int, best: float, cfg: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "best_wer": best, "settings": cfg, "model_config": model.config_dict()}, tmp)
    os.replace(tmp, path)  # never leave a half-written checkpoint


def log(out: Path, record: dict) -> None:
    record = {"time": round(time.time(), 1), **record}
    with open(out / "train.log", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
