"""The `parley` command: config printed with secrets masked, serves, stops on SIGTERM, clear config errors."""

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

ENV = {**os.environ, "PARLEY_SECRET": "s3cret-value", "PARLEY_ICE_ADDRESSES": "127.0.0.1"}


def test_serve_prints_config_and_stops_cleanly():
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0", "--max-sessions", "7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        config_line = proc.stdout.readline()
        assert config_line.startswith("Parley configuration: ")
        config = json.loads(config_line.split(": ", 1)[1])
        assert config["max_sessions"] == 7 and config["secret"] == "***" and config["ice_addresses"] == ["127.0.0.1"]
        assert "s3cret-value" not in config_line
        url = re.search(r"http://\S+", proc.stdout.readline()).group(0)
        with urllib.request.urlopen(url + "/livez", timeout=30) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("args, env, message", [
    (["--max-sessions", "0"], {}, "max_sessions: 0 must be at least 1"),
    (["--mode", "karaoke"], {}, "mode: 'karaoke' is not one of"),
    ([], {"PARLEY_PORT": "eighty"}, "port: cannot read 'eighty' as int"),
])
def test_config_errors_are_clear(args, env, message):
    result = subprocess.run([sys.executable, "-m", "gateway", "serve", *args], capture_output=True, text=True,
                            env={**ENV, **env}, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize("toml, message", [
    ("porty = 9000\n", "unknown key 'porty'"),
    ('port = "eighty"\n', "port: expected int, got str 'eighty'"),
    ("max_sessions = true\n", "max_sessions: expected int, got bool True"),
    ('stun_urls = "stun:a:3478"\n', "stun_urls: expected a list of strings"),
    ("port = \n", "not valid TOML"),
])
def test_config_file_errors_are_clear(tmp_path, toml, message):
    path = tmp_path / "parley.toml"
    path.write_text(toml)
    result = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path)], capture_output=True,
                            text=True, env=ENV, timeout=60)
    assert result.returncode == 2
    assert f"config file {path}" in result.stderr and message in result.stderr


def test_config_precedence_defaults_file_env_flags(tmp_path):
    path = tmp_path / "parley.toml"
    path.write_text('port = 9000\nmax_sessions = 5\necho_delay_ms = 250\nstun_urls = ["stun:stun.example.org:3478"]\n'
                    "drain_timeout_s = 12\n")
    env = {**ENV, "PARLEY_CONFIG": str(path), "PARLEY_MAX_SESSIONS": "6", "PARLEY_ECHO_DELAY_MS": "300"}
    result = subprocess.run([sys.executable, "-m", "gateway", "config"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout.split(": ", 1)[1])
    assert config["port"] == 9000 and config["max_sessions"] == 6 and config["echo_delay_ms"] == 300
    assert config["stun_urls"] == ["stun:stun.example.org:3478"] and config["drain_timeout_s"] == 12.0
    assert config["opus_bitrate"] == 32000  # untouched default

    from gateway import config as config_module
    from gateway.cli import build_parser
    args = build_parser().parse_args(["serve", "--config", str(path), "--max-sessions", "7"])
    assert config_module.load(args, environ={"PARLEY_MAX_SESSIONS": "6"}).max_sessions == 7


def test_missing_config_file_is_clear(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gateway", "serve"], capture_output=True, text=True,
                            env={**ENV, "PARLEY_CONFIG": str(tmp_path / "absent.toml")}, timeout=60)
    assert result.returncode == 2 and "cannot read it" in result.stderr


@pytest.mark.parametrize("settings, message", [
    ({"engine_device": "tpu"}, "engine_device: 'tpu' is not one of auto, cpu, cuda"),
    ({"engine_max_streams": 0}, "engine_max_streams must be at least 1"),
    ({"stt_weights": "/nonexistent/stt.safetensors"}, "stt_weights: '/nonexistent/stt.safetensors' is not a file"),
    ({"redis_url": "localhost:6379"}, "redis_url: 'localhost:6379' must start with redis://"),
    ({"public_url": "10.0.0.5:8080"}, "public_url: '10.0.0.5:8080' must start with http://"),
    ({"new_calls_without_redis": "maybe"}, "new_calls_without_redis: 'maybe' is not one of accept, reject"),
    ({"lease_ttl_s": 0}, "lease_ttl_s and peer_timeout_s must be positive"),
    ({"turn_end_probability": 1.0}, "turn_end_probability: 1.0 is outside 0-1"),
    ({"turn_end_probability": -0.1}, "turn_end_probability: -0.1 is outside 0-1"),
])
def test_engine_and_session_settings_are_validated(settings, message):
    from gateway.config import Config, ConfigError

    with pytest.raises(ConfigError) as caught:
        Config(**settings).validate()
    assert message in str(caught.value)


def test_redis_password_is_masked_when_printed():
    from gateway.config import Config

    masked = Config(redis_url="redis://parley:hunter2@redis:6379/0").validate().masked()
    assert masked["redis_url"] == "redis://parley:***@redis:6379/0" and masked["secret"] == "***"


def test_say_writes_the_shipped_voice_to_a_wav(tmp_path):
    import wave

    out = tmp_path / "reply.wav"
    done = subprocess.run([sys.executable, "-m", "gateway", "say", "Your order ships on Monday.", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with wave.open(str(out), "rb") as f:
        rate, audio = f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), "<i2")
    assert rate == 22050 and 1.0 < len(audio) / rate < 5.0
    assert np.abs(audio.astype(np.float32)).max() > 1000  # speech, not silence
    empty = subprocess.run([sys.executable, "-m", "gateway", "say", "  ", "--out", str(tmp_path / "x.wav")],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "nothing to say" in empty.stderr


def test_replay_reports_the_turns_of_a_recorded_call(tmp_path):
    """A recording as a gateway with record_dir writes it: half a second of quiet, one spoken
    utterance (no reply on the reference channel), then quiet. `parley replay` finds the one
    caller turn, when its speech started and when the recognizer ended it."""
    from gateway.echo_suppressor import FRAME
    from gateway.recording import CallRecording
    from engine.wavfile import read_wav
    from tests.test_stt_shipped import SPEECH

    speech = (read_wav(SPEECH / "flite_slt-020.wav", 16000) * 32767).astype(np.int16)
    inbound = np.concatenate([np.zeros(8000, np.int16), speech, np.zeros(16000 * 3, np.int16)])
    inbound = inbound[:len(inbound) // FRAME * FRAME]
    recording = CallRecording(tmp_path / "call.wav")
    for start in range(0, len(inbound), FRAME):
        recording.write(inbound[start:start + FRAME], np.zeros(FRAME, np.int16))
    recording.close()
    done = subprocess.run([sys.executable, "-m", "gateway", "replay", str(tmp_path / "call.wav"), "--json",
                           "--fresh-lead", "0.5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["settings"]["fresh_lead_s"] == 0.5
    assert report["duration_s"] == round(len(inbound) / 16000, 2)
    [turn] = report["turns"]
    assert 0.5 <= turn["start_s"] < 1.5 and turn["over_reply"] is False  # the clip opens with its own quiet
    assert turn["speech_start_ms"] is not None and turn["end_of_turn_ms"]["call"] is not None, report
    assert turn["ended_early"] == 0
    lines = subprocess.run([sys.executable, "-m", "gateway", "replay", str(tmp_path / "call.wav")],
                           capture_output=True, text=True, timeout=300)
    assert lines.returncode == 0 and "over reply: False" in lines.stdout, lines.stderr
