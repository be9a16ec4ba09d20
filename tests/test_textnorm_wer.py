"""The WER scoring form (engine.wer.normalize_for_wer): spoken and written
numbers meet in one canonical digit form, so a recogniser that writes "412" is scored
the same as one that says "four one two". Fast; no model needed."""

import pytest

from engine.wer import normalize_for_wer, number_words_to_digits
from engine.wer import word_error_rate


@pytest.mark.parametrize("words, digits", [
    ("four one two", "412"),
    ("four hundred twelve", "412"),
    ("twenty twenty four", "2024"),
    ("nineteen ninety nine", "1999"),
    ("nineteen oh five", "1905"),
    ("two thousand five", "2005"),
    ("two thousand eight hundred thirteen", "2813"),
    ("one million two hundred thousand", "1200000"),
    ("twenty one", "21"),
    ("three oh five", "305"),
    ("zero seven one oh oh four", "071004"),
    ("one hundred and five", "105"),
    ("hundred", "100"),
    ("thousand", "1000"),
    ("ten five", "105"),
])
def test_number_words_to_digits(words, digits):
    assert number_words_to_digits(words.split()) == digits


@pytest.mark.parametrize("spoken, written", [
    ("my order number is zero seven one oh oh four", "My order number is 071004."),
    ("it's account six three eight four two three", "It's account 638423."),
    ("the bill says twelve dollars and ninety nine cents", "The bill says $12.99"),
    ("two thousand eight hundred thirteen dollars", "$2,813"),
    ("i ordered it on january tenth twenty twenty five", "I ordered it on January 10th, 2025"),
    ("call me at three oh five p m", "Call me at 3:05 PM"),
    ("four hundred twelve", "four one two"),
    ("um okay so uh that's it", "OK, so that's it."),
    ("could somebody come by at seven forty five a m", "Could somebody come by at 7.45 am?"),
    ("i ordered it on january tenth twenty twenty five", "I ordered it on January 10, 2025"),
    ("the fifth of november", "the 5th of November"),
])
def test_spoken_and_written_forms_score_equal(spoken, written):
    assert normalize_for_wer(spoken) == normalize_for_wer(written)
    assert word_error_rate([normalize_for_wer(spoken)], [normalize_for_wer(written)]) == 0.0


@pytest.mark.parametrize("text, expected", [
    ("Oh no, not again", "oh no not again"),  # 'oh' outside a number stays a word
    ("oh four one two", "oh 412"),  # a leading 'oh' is not taken for a zero
    ("one two oh", "12 oh"),  # nor a trailing one
    ("rock and roll", "rock and roll"),
    ("one hundred and five and six", "105 and 6"),  # 'and' joins only after hundred/scale
    ("", ""),
    ("it costs 7.45 dollars", "it costs 7 point 45 dollars"),  # a dotted number without am/pm
    ("May 45 people", "may 45 people"),  # not a day of the month
    ("January 2025", "january 2025"),
])
def test_non_numbers_unchanged(text, expected):
    assert normalize_for_wer(text) == expected


def test_wrong_digit_still_counts_as_error():
    assert normalize_for_wer("four one two") != normalize_for_wer("four one three")
    assert word_error_rate([normalize_for_wer("account four one two")],
                           [normalize_for_wer("account 413")]) == 0.5
