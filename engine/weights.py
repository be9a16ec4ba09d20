"""Shipped weights: safetensors files under engine/weights/, each with its config inside.

A checkpoint is one .safetensors file whose metadata holds the model's config as JSON, so
a model can be rebuilt from the file alone. Files stay under 25 MB (the repo's limit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MAX_FILE_BYTES = 25 * 1024 * 1024


def save(model: torch.nn.Module, config: dict[str, Any], path: Path, info: dict[str, Any] | None = None) -> None:
    """Write fp32 weights with {"config": ..., "info": ...} as metadata."""
    tensors = {name: t.detach().float().contiguous().cpu() for name, t in model.state_dict().items()}
    metadata = {"config": json.dumps(config), "info": json.dumps(info or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"{path} is {path.stat().st_size} bytes, over the {MAX_FILE_BYTES} limit")


def read_metadata(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, info) stored in a weights file."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta.get("config", "{}")), json.loads(meta.get("info", "{}"))


def load_state(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}; train them with the recipe in engine/train/")
    return load_file(str(path), device=device)


def load_model(model_class: type, config_class: type, path: Path, device: str = "cpu") -> torch.nn.Module:
    """A model from a shipped .safetensors file or a training checkpoint (.pt), in eval mode.

    Raises FileNotFoundError naming the path when there is no such file (not trained yet).
    """
    if not path.exists():
        raise FileNotFoundError(f"no {model_class.__name__} weights at {path}")
    if path.suffix == ".pt":
        checkpoint = torch.load(path, map_location=device, weights_only=False)
        config, state = checkpoint["model_config"], checkpoint["model"]
    else:
        config, state = read_metadata(path)[0], load_state(path, device)
    model = model_class(config_class(**config))
    model.load_state_dict(state)
    return model.to(device).eval()
