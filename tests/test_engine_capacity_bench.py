"""bench/engine_capacity.py runs end to end on a tiny size and reports every field (the
figures themselves are the benchmark's business, not a test's)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_capacity_bench_reports_full_duplex_rows():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "engine_capacity.py"), "--sizes", "2", "--seconds", "3",
         "--warm-up", "0.5", "--no-stop", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["device"] == "cpu" and report["ttfa_budget_ms"] == 100.0 and len(report["rows"]) == 1
    row = report["rows"][0]
    for field in ("lag_ms_p95", "tick_ms_p99", "ttfa_ms_p50", "ttfa_ms_p95", "replies", "late_audio_chunks",
                  "state_bytes_per_stream", "within_budget"):
        assert field in row
    assert row["n"] == 2 and row["streams_failed"] == 0 and row["frames"] > 0
    assert row["replies"] >= 1 and row["ttfa_ms_p50"] > 0, "every call starts a reply in the window"
    assert report["max_streams"] in (0, 2)


def test_capacity_bench_times_turn_ends_when_whisper_reads_clips():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "engine_capacity.py"), "--sizes", "1", "--seconds", "8",
         "--warm-up", "0.5", "--no-stop", "--no-tts", "--audio", str(REPO / "tests" / "data" / "speech"), "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["stt_model"] == "whisper-tiny.en" and report["readers"] == 1
    row = report["rows"][0]
    for field in ("turn_end_ms_p50", "turn_end_ms_p95", "turns_ended", "turns_missed", "partials_per_turn",
                  "reading_wait_ms_p95", "reader_busy_pct"):
        assert field in row
    assert row["readings"] >= 1 and row["turns_ended"] + row["turns_missed"] >= 1, row


def test_capacity_bench_prices_the_voice_alone_with_no_stt():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "engine_capacity.py"), "--sizes", "2", "--seconds", "4",
         "--warm-up", "0.5", "--no-stop", "--no-stt", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    row = json.loads(result.stdout)["rows"][0]
    assert row["lag_ms_p95"] is None, "no caller audio is heard with --no-stt"
    assert row["replies"] >= 1 and row["reply_audio_s"] > 0
    assert 0 < row["cpu_s_per_reply_audio_s"] < 10, row


def test_capacity_bench_refuses_to_measure_nothing():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "engine_capacity.py"), "--no-stt", "--no-tts"],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "leave nothing to measure" in result.stderr
