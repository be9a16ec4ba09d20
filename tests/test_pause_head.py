"""The pause head (engine/pause_head.py): shipped weights, what it hears, how a reading asks it."""

from pathlib import Path

import numpy as np
import pytest

from engine.pause_head import POOLS, SHIPPED_WEIGHTS, WINDOW_S, PauseHead, head_window, load_pause_head, pooled_features
from engine.whisper import SAMPLE_RATE, WhisperReader
from engine.whisper_readers import read_job
from engine.whisper_stream import PARTIAL, PAUSE, Job

WIDTH = 384  # tiny.en's encoder width


@pytest.fixture(scope="module")
def reader():
    return WhisperReader(threads=1)


def a_head(bias: float) -> PauseHead:
    features = len(POOLS) * WIDTH
    return PauseHead(np.zeros(features, np.float32), np.ones(features, np.float32), np.zeros(features, np.float32),
                     bias, threshold=0.5)


def test_the_shipped_head_loads_with_the_figures_it_was_chosen_by():
    head = load_pause_head()
    assert head.weight.shape == (len(POOLS) * WIDTH,) and 0 < head.threshold < 1
    info = head.info
    assert info["validation_auc"] >= 0.85, info  # on held-out synthetic turns (engine/train/train_pause_head.py)
    assert info["validation_pauses_called"] <= 0.05, info


def test_a_head_trained_on_other_features_is_refused(tmp_path):
    head = load_pause_head()
    path = tmp_path / "head.safetensors"
    head.save(path)
    from safetensors.numpy import load_file, save_file

    save_file(load_file(str(path)), str(path), metadata={"info": "{}", "pools": "[[0.0, 0.5]]", "window_s": "2.0"})
    with pytest.raises(ValueError, match="other features"):
        load_pause_head(path)
    assert load_pause_head(SHIPPED_WEIGHTS).threshold == head.threshold


def test_the_head_hears_a_fixed_window_so_a_turn_s_length_is_no_cue():
    short, long = np.full(SAMPLE_RATE, 0.1, np.float32), np.full(5 * SAMPLE_RATE, 0.1, np.float32)
    assert len(head_window(short)) == len(head_window(long)) == int(WINDOW_S * SAMPLE_RATE)
    assert np.array_equal(head_window(long), long[-int(WINDOW_S * SAMPLE_RATE):])
    assert not head_window(short)[:SAMPLE_RATE].any()  # silence in front of a short turn
    encoding = np.arange(100 * WIDTH, dtype=np.float32).reshape(1, 100, WIDTH)
    pooled = pooled_features(encoding, 100)
    assert pooled.shape == (len(POOLS) * WIDTH,)
    assert pooled[0] == encoding[0, 90:100, 0].mean()  # the last 0.2 s: positions 90-99


def test_only_a_pause_reading_asks_the_head_and_it_keeps_its_words(reader):
    audio = (0.1 * np.sin(np.arange(SAMPLE_RATE) * 0.05)).astype(np.float32)
    for bias, ended in ((10.0, True), (-10.0, False)):
        job = Job(1, PAUSE, audio, 0, len(audio), 1.0)
        assert read_job(reader, a_head(bias), job) == reader.read(audio)
        assert job.voice_ended is ended
    partial = Job(1, PARTIAL, audio, 0, len(audio), 1.0)
    read_job(reader, a_head(10.0), partial)
    assert partial.voice_ended is None
    paused = Job(1, PAUSE, audio, 0, len(audio), 1.0)
    read_job(reader, None, paused)
    assert paused.voice_ended is None
    assert Path(SHIPPED_WEIGHTS).stat().st_size < 64 * 1024
