"""bench/stt_anchors.py scoring and table, with a fake recogniser (no models loaded)."""

import numpy as np

from bench.stt_anchors import markdown_table, score_folder

SR = 16000


def test_score_folder_uses_fair_normaliser_and_counts_rtf():
    items = [(np.zeros(SR, np.float32), "my order number is four one two"),
             (np.zeros(2 * SR, np.float32), "twelve dollars and ninety nine cents")]
    answers = iter(["My order number is 412.", "$12.99"])
    row = score_folder(lambda audio: (next(answers), len(audio) / SR), items)
    assert row["wer"] == 0.0 and row["cer"] == 0.0 and row["n"] == 2
    assert row["rtf"] is not None and row["rtf"] >= 0


def test_markdown_table_has_a_row_per_folder():
    row = {"wer": 0.1, "cer": 0.05, "rtf": 0.02, "n": 3}
    table = markdown_table({"a": {"whisper": row}, "b": {"whisper": row}}, ["whisper"])
    lines = table.splitlines()
    assert lines[0] == "| set | n | whisper WER | whisper CER | whisper RTF |"
    assert lines[2] == "| a | 3 | 0.100 | 0.050 | 0.020 |" and len(lines) == 4
