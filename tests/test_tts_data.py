"""Teacher-data bookkeeping that needs no teacher: shards drawn with different Piper noise
settings never share a folder."""

import json

import pytest

from engine.train.tts_data import PIPER_NOISE, check_teacher_settings

DETERMINISTIC = {"noise_scale": 0.0, "noise_w": 0.0}
PIPER_DEFAULT = PIPER_NOISE


def test_a_new_folder_records_its_teacher_settings(tmp_path):
    check_teacher_settings(tmp_path, DETERMINISTIC)
    assert json.loads((tmp_path / "teacher.json").read_text()) == DETERMINISTIC
    check_teacher_settings(tmp_path, DETERMINISTIC)  # the same settings resume


def test_other_settings_are_refused_with_a_clear_error(tmp_path):
    check_teacher_settings(tmp_path, DETERMINISTIC)
    with pytest.raises(SystemExit, match="use another --out"):
        check_teacher_settings(tmp_path, PIPER_DEFAULT)


def test_shards_from_before_the_record_count_as_piper_default_draws(tmp_path):
    (tmp_path / "shard_00000.npz").write_bytes(b"")
    with pytest.raises(SystemExit, match="0.667"):
        check_teacher_settings(tmp_path, DETERMINISTIC)
    check_teacher_settings(tmp_path, PIPER_DEFAULT)
