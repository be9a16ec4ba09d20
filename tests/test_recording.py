"""Call recordings: the frames the suppressor consumed, written and read back exactly."""

from __future__ import annotations

import re
import wave

import numpy as np
import pytest

from gateway.cli import main as parley
from gateway.config import Config, ConfigError
from gateway.echo_suppressor import FRAME, EchoSuppressor
from gateway.recording import CallRecording, read_recording
from gateway.replay import suppress


def test_frames_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    inbound = rng.integers(-20000, 20000, FRAME * 5).astype(np.int16)
    reference = rng.integers(-20000, 20000, FRAME * 5).astype(np.int16)
    recording = CallRecording(tmp_path / "call.wav")
    for start in range(0, len(inbound), FRAME):
        recording.write(inbound[start:start + FRAME], reference[start:start + FRAME])
    recording.close()
    recording.write(inbound[:FRAME], reference[:FRAME])  # after close: ignored, not a crash
    got_inbound, got_reference = read_recording(tmp_path / "call.wav")
    np.testing.assert_array_equal(got_inbound, inbound)
    np.testing.assert_array_equal(got_reference, reference)


def test_replaying_the_recorded_reference_reproduces_the_suppressor(tmp_path):
    """The right channel is what the suppressor lined up with each inbound frame, so a fresh
    suppressor fed the recording frame by frame gives the live output exactly, even when the
    reference arrived in pieces of other sizes and ahead of the inbound frames."""
    rng = np.random.default_rng(2)
    t = np.arange(FRAME * 150) / 16000
    sent = (8000 * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 0.7 * t) > 0)).astype(np.int16)
    echo = np.concatenate([np.zeros(1600), sent[:-1600] * 0.5]) + rng.normal(0, 30, len(sent))
    live, recording = EchoSuppressor(), CallRecording(tmp_path / "call.wav")
    live_out = []
    for i, start in enumerate(range(0, len(sent), FRAME)):
        if i % 3 == 0:  # the pacer's pieces: 60 ms at a time
            live.add_reference(sent[start:start + 3 * FRAME])
        frame = echo[start:start + FRAME].astype(np.int16)
        live_out.append(live.process(frame))
        recording.write(frame, live.last_reference)
    recording.close()
    inbound, reference = read_recording(tmp_path / "call.wav")
    np.testing.assert_array_equal(suppress(inbound, reference), np.concatenate(live_out))


def test_a_file_that_is_not_a_recording_is_refused(tmp_path):
    with wave.open(str(tmp_path / "mono.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(np.zeros(160, np.int16).tobytes())
    with pytest.raises(ValueError, match="not a Parley call recording"):
        read_recording(tmp_path / "mono.wav")


def test_record_dir_must_exist(tmp_path):
    assert Config(record_dir=str(tmp_path)).validate().record_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="record_dir"):
        Config(record_dir=str(tmp_path / "missing")).validate()


def test_replaying_something_that_is_not_a_recording_says_so(tmp_path, capsys):
    (tmp_path / "notes.wav").write_text("not audio")
    assert parley(["replay", str(tmp_path / "notes.wav")]) == 2
    assert re.match(r"parley replay: .*RIFF", capsys.readouterr().err)
    assert parley(["replay", str(tmp_path / "missing.wav")]) == 2
    assert re.match(r"parley replay: .*No such file", capsys.readouterr().err)
