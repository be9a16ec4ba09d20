"""What every training recipe here shares: atomic checkpoints and a JSON-lines log."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch


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
