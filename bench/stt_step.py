"""The STT model's streaming step, float against int8, side by side: milliseconds per step.

    python -m bench.stt_step [--weights FILE] [--batches 1,16,64] [--steps 400] [--threads 1] --json

One step is one 40 ms frame for B streams at once (`SttModel.step` for "float", the
frozen `FrozenSttModel` of engine/inference.py for "int8", as `engine.stt.streaming_model`
picks them; "int8_torch" is the same int8 model multiplied by torch's kernel instead of
Parley's own, engine/cpu_kernels.py, where that is built). They alternate every step on the
same random frames and carried states, so a noisy machine slows them alike; the first 50 steps of each batch size are not counted.
Reported per batch size: step_ms_p50 / p95 of each, the p50 ratio, and rtf_per_stream
(p50 step / 40 ms / B: the model's share of one stream's real-time budget).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from engine.audio import FRAMES_PER_STEP, N_MELS
from engine.inference import default_int8_kernel
from engine.stt import FRAME_S, FrozenSttModel, load_model

WARM_UP_STEPS = 50


def time_steps(models: dict, batch: int, steps: int) -> dict[str, list[float]]:
    """Alternating steps of every model on the same frames; seconds per step, warm-up dropped."""
    states = {name: model.initial_state(batch) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    generator = torch.Generator().manual_seed(batch)
    with torch.inference_mode():
        for _ in range(steps + WARM_UP_STEPS):
            frame = torch.randn(batch, FRAMES_PER_STEP * N_MELS, generator=generator)
            for name, model in models.items():
                started = time.perf_counter()
                _, _, states[name] = model.step(frame, states[name])
                times[name].append(time.perf_counter() - started)
    return {name: values[WARM_UP_STEPS:] for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", help="STT weights (default: shipped)")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(Path(args.weights) if args.weights else None).eval()
    models = {"float": model, "int8": FrozenSttModel(model)}
    if default_int8_kernel() == "parley":
        models["int8_torch"] = FrozenSttModel(model, kernel="torch")
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        times = time_steps(models, batch, args.steps)
        row = {"batch": batch}
        for name, values in times.items():
            p50 = float(np.median(values))
            row[f"{name}_step_ms_p50"] = round(p50 * 1000, 3)
            row[f"{name}_step_ms_p95"] = round(float(np.percentile(values, 95)) * 1000, 3)
            row[f"{name}_rtf_per_stream"] = round(p50 / FRAME_S / batch, 4)
        row["float_over_int8_p50"] = round(row["float_step_ms_p50"] / row["int8_step_ms_p50"], 2)
        if "int8_torch" in models:
            row["int8_torch_over_int8_p50"] = round(row["int8_torch_step_ms_p50"] / row["int8_step_ms_p50"], 2)
        rows.append(row)
    print(json.dumps({"benchmark": "stt_step", "weights": args.weights or "shipped", "threads": args.threads,
                      "int8_kernel": default_int8_kernel(),
                      "steps": args.steps, "load_avg_1m": round(os.getloadavg()[0], 2), "rows": rows}))


if __name__ == "__main__":
    main()
