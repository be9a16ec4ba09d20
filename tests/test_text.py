"""TTS text front-end (engine/text.py): normalization, Piper phoneme ids, incremental release."""

import time

import pytest

from engine.text import (MAX_PENDING_CHARS, IncrementalText, normalize_text, phoneme_id_map, phonemize,
                         spoken_words)

RESPONSE = ("Sure, I can help with that. Your order AB1234 shipped on 3/15/2024 and the total was $1,249.99! "
            "Call 555-123-4567 between 9:30 am and 5 pm, or visit Dr. Lee at 12 Elm St. on the 3rd floor. "
            "Your account number is 0041 2788 and you have 45% off today")


def release(text: str, pieces: list[str]):
    stream = IncrementalText()
    phrases = []
    for piece in pieces:
        phrases += stream.push(piece)
    return phrases + stream.end()


@pytest.mark.parametrize("written, spoken", [
    ("$12.50", "twelve dollars and fifty cents"),
    ("$1,249.99", "one thousand two hundred forty nine dollars and ninety nine cents"),
    ("$3.5 million", "three point five million dollars"),
    ("3:05 pm", "three oh five P M"),
    ("at 10:30", "at ten thirty"),
    ("3/15/2024", "March fifteenth, twenty twenty four"),
    ("2024-03-05", "March fifth, twenty twenty four"),
    ("the 21st", "the twenty first"),
    ("order 0412", "order zero four one two"),
    ("ticket 1234567890", "ticket one two three, four five six, seven eight nine, zero"),
    ("555-123-4567", "five five five, one two three, four five six seven"),
    ("code AB12", "code ay B one two"),
    ("Dr. Smith", "Doctor Smith"),
    ("45% off", "forty five percent off"),
    ("1,250 points", "one thousand two hundred fifty points"),
])
def test_normalization_reads_like_an_agent(written, spoken):
    assert normalize_text(written).rstrip(".") == spoken


def test_phoneme_ids_are_piper_joes():
    valid = {i for ids in phoneme_id_map().values() for i in ids}
    phrase, open_sentence = phonemize("Hello there, how are you?")
    assert phrase.ids[0] == 1 and phrase.ids[-1] == 2 and not open_sentence  # BOS ... EOS
    assert set(phrase.ids) <= valid
    assert phrase.words == ["Hello", "there", "how", "are", "you"]
    assert phrase.word_starts == sorted(phrase.word_starts)


def test_incremental_release_does_not_depend_on_the_deltas():
    at_once = release(RESPONSE, [RESPONSE])
    by_char = release(RESPONSE, list(RESPONSE))
    by_word = release(RESPONSE, [w + " " for w in RESPONSE.split(" ")])
    for other in (by_char, by_word):
        assert [p.text for p in other] == [p.text for p in at_once]
        assert [p.ids for p in other] == [p.ids for p in at_once]
    assert sum(len(p.words) for p in at_once) == len(spoken_words(normalize_text(RESPONSE)))
    # same ids as phonemizing the whole text at once (the teacher's view)
    assert sum((p.ids for p in at_once), []) == phonemize(normalize_text(RESPONSE))[0].ids


def test_phrases_are_released_before_the_text_ends():
    stream = IncrementalText()
    assert stream.push("Sure") == []
    first = stream.push(", I can")
    assert [p.text for p in first] == ["Sure,"]
    words = stream.push(" help you with that order right now if")
    assert words and words[0].text.startswith("I can help")  # a word boundary with lookahead


@pytest.mark.parametrize("hostile", [
    "", "   ", "\x00\x01\x07\x1b[31m", "😀🎉👍" * 50, "你好世界 Привет мир مرحبا", "<speak><break time='1s'/>hi</speak>",
    "<<<<>>>>", "...,,,!!!???", "$$$ %%% ###", "9" * 300, "A" * 5000, "ﬁ ﬂ ① Ⅻ ㎞", "\u202e\u200b\ufeff",
    "-" * 1000, "$99999999999999999999999", "3:99 pm 13/45/2024 99:99",
])
def test_hostile_text_gives_sane_output(hostile):
    phrases = release(hostile, [hostile])
    for phrase in phrases:
        assert len(phrase.ids) == 0 or phrase.ids[-1] in (2, 0, 3)
        assert all(0 <= i < 256 for i in phrase.ids)


def test_huge_text_is_bounded():
    text = "This is a long reply, and it keeps going. " * 2400  # ~100 kB
    started = time.monotonic()
    phrases = release(text, [text])
    assert len(phrases) >= 4000
    assert time.monotonic() - started < 600  # generous: a hang would be minutes more
    with pytest.raises(ValueError, match="unreleased text"):
        IncrementalText().push("x" * (MAX_PENDING_CHARS + 1))


def test_protocol_errors_are_clear():
    stream = IncrementalText()
    stream.end()
    with pytest.raises(RuntimeError):
        stream.push("more")
    with pytest.raises(TypeError):
        IncrementalText().push(b"bytes")  # type: ignore[arg-type]
