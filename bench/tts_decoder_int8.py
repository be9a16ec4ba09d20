"""Does int8 make Piper joe's HiFi-GAN decoder cheaper without changing the voice? (issue 31)

onnxruntime static QDQ quantization of the decoder as Parley runs it (engine/piper.py: 2-D
convolutions), per-channel int8 weights, uint8 activations, calibrated on decoder inputs (z)
of bench/tts_train_lines.txt[:20] and judged on whole utterances of lines [20:40] (never the
held-out texts) against the fp32 decoder's audio of the same z:

- cpu_s_per_audio_s: process CPU time per second of audio, 48-frame windows (a 32-frame chunk
  with the decoder's 8 frames of context either side), one thread, best of 3 interleaved rounds;
- rel_rms: waveform error over the fp32 RMS (HiFi-GAN's phase follows z exactly, so this
  overstates what is heard);
- mel_l1_db: mean |log-mel difference| (80 bands to 8 kHz, 1024-point FFT, hop 256) over
  frames with speech (loudest band within 60 dB of the utterance's peak), bins floored 80 dB
  under the peak;
- pause_rise_db: how much louder the frames in pauses (loudest band 45 dB or more under the
  peak) come out: quantization noise that does not scale with the signal is heard as hiss there;
- snr_db: fp32 audio power over the power of the difference.

Usage: python bench/tts_decoder_int8.py [--variants all,first_stage] --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine import piper, tts
from engine.text import IncrementalText

LINES = Path(__file__).with_name("tts_train_lines.txt")
STAGE_3 = ["ups.2", "resblocks.6", "resblocks.7", "resblocks.8", "conv_post"]  # 22.05 kHz, 32 channels
STAGE_2 = ["ups.1", "resblocks.3", "resblocks.4", "resblocks.5"]  # 5.5 kHz, 64 channels
VARIANTS = {  # name -> (node name parts kept in fp32, calibration)
    "all": ([], "minmax"),
    "all_but_conv_post": (["conv_post"], "minmax"),
    "stages_1_2": (STAGE_3, "minmax"),
    "stages_1_2_percentile": (STAGE_3, "percentile"),
    "stages_1_2_resblocks_percentile": (STAGE_3 + ["ups.1"], "percentile"),
    "first_stage": (STAGE_3 + STAGE_2, "minmax"),
    "first_stage_percentile": (STAGE_3 + STAGE_2, "percentile"),
}


def utterance_z(flow, line: str) -> np.ndarray:
    text = IncrementalText()
    ids = [i for phrase in text.push(line) + text.end() for i in phrase.ids]
    prior = tts.utterance_prior(tts.load_model(), ids)
    return flow.run(None, {piper.FLOW_INPUT: prior[None], piper.FRAME_MASK: np.ones((1, 1, prior.shape[1]), np.float32)})[0]


def log_mel(audio: np.ndarray, n_fft: int = 1024, hop: int = 256, bands: int = 80, top_hz: float = 8000) -> np.ndarray:
    mel = lambda hz: 2595 * np.log10(1 + hz / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(0, mel(top_hz), bands + 2) / 2595) - 1)
    freqs = np.linspace(0, piper.SAMPLE_RATE / 2, n_fft // 2 + 1)
    bank = np.stack([np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0, None)
                     for lo, mid, hi in zip(edges, edges[1:], edges[2:])])
    padded = np.pad(audio.astype(np.float64), n_fft // 2)
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop] * np.hanning(n_fft)
    return 10 * np.log10(bank @ (np.abs(np.fft.rfft(frames, axis=1)) ** 2).T + 1e-10)


def distances(reference: np.ndarray, audio: np.ndarray) -> dict[str, float]:
    ref, got = log_mel(reference), log_mel(audio)
    peak = ref.max()
    loudest = ref.max(axis=0)
    speech, pauses = loudest > peak - 60, loudest < peak - 45
    floored = np.abs(np.maximum(ref, peak - 80) - np.maximum(got, peak - 80))
    return {"rel_rms": float(np.sqrt(np.mean((audio - reference) ** 2) / np.mean(reference ** 2))),
            "mel_l1_db": float(floored[:, speech].mean()),
            "pause_rise_db": float((got - ref)[:, pauses].mean()) if pauses.any() else 0.0,
            "snr_db": float(10 * np.log10(np.mean(reference ** 2) / np.mean((audio - reference) ** 2)))}


def cpu_per_audio_s(session, windows: list[np.ndarray]) -> float:
    started = time.process_time()
    for z in windows:
        session.run(None, {piper.LATENT: z})
    return (time.process_time() - started) / (sum(z.shape[2] for z in windows) * piper.HOP / piper.SAMPLE_RATE)


def main() -> None:
    import onnx
    import onnx.utils
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [line.strip() for line in LINES.read_text().splitlines() if line.strip()]
    calibration_lines, evaluation_lines = lines[:20], lines[20:40]
    flow = piper._cut([piper.FLOW_INPUT, piper.FRAME_MASK], [piper.LATENT], 1, conv2d=True)
    rng = np.random.default_rng(0)
    calibration = []
    for line in calibration_lines:
        z = utterance_z(flow, line)
        calibration += [z[:, :, s:s + 48] for s in rng.integers(0, max(1, z.shape[2] - 48), size=4)]
    evaluation = [utterance_z(flow, line) for line in evaluation_lines]
    windows = [z[:, :, 5:53] for z in evaluation if z.shape[2] >= 53]

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    open_session = lambda path: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix="tts-int8-"))
    decoder = piper._as_conv2d(onnx.utils.Extractor(piper._verified_graph()).extract_model([piper.LATENT], [piper.AUDIO]))
    onnx.save(decoder, work / "fp32.onnx")
    quant_pre_process(str(work / "fp32.onnx"), str(work / "pre.onnx"), skip_symbolic_shape=True)
    convs = [n.name for n in onnx.load(work / "pre.onnx").graph.node if n.op_type in ("Conv", "ConvTranspose")]

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.windows = iter(calibration)

        def get_next(self):
            z = next(self.windows, None)
            return None if z is None else {piper.LATENT: z}

    sessions = {"fp32": open_session(work / "fp32.onnx")}
    results: dict[str, dict] = {}
    for name in args.variants.split(","):
        kept, method = VARIANTS[name]
        with contextlib.redirect_stdout(sys.stderr):  # the quantizer prints its progress
            quantize_static(str(work / "pre.onnx"), str(work / f"{name}.onnx"), Calibration(), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            calibrate_method={"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}[method],
                            op_types_to_quantize=["Conv", "ConvTranspose"],
                            nodes_to_exclude=[n for n in convs if any(f"/{part}/" in n for part in kept)],
                            extra_options={"CalibPercentile": 99.99})
        sessions[name] = open_session(work / f"{name}.onnx")
        results[name] = {"fp32_parts": kept, "calibration": method}
    references = [sessions["fp32"].run(None, {piper.LATENT: z})[0].reshape(-1) for z in evaluation]
    for name in results:
        scores = [distances(ref, sessions[name].run(None, {piper.LATENT: z})[0].reshape(-1))
                  for ref, z in zip(references, evaluation)]
        results[name].update({key: round(float(np.mean([s[key] for s in scores])), 3) for key in scores[0]})
    best = {name: float("inf") for name in sessions}
    for _ in range(3):  # interleaved, so drift in the machine's load hits every variant alike
        for name, session in sessions.items():
            best[name] = min(best[name], cpu_per_audio_s(session, windows))
    results = {"fp32": {}, **results}
    for name in results:
        results[name]["cpu_s_per_audio_s"] = round(best[name], 4)
    report = {"benchmark": "tts_decoder_int8", "onnxruntime": ort.__version__, "calibration_lines": "tts_train_lines[:20]",
              "evaluation_lines": "tts_train_lines[20:40]", "evaluation_audio_s": round(sum(r.size for r in references) / piper.SAMPLE_RATE, 1),
              "variants": results}
    print(json.dumps(report, indent=1) if args.json else "\n".join(f"{k}: {v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
