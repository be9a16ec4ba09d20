"""engine.turn: the turn-completion table, and how StreamDecoder weighs it against the head."""

import gzip
import os
from pathlib import Path

import pytest

from engine.interface import EndOfTurn, Final
from engine.stt import BLANK, CONTINUATION_FRAMES, SILENT_TURN_END_FRAMES, StreamDecoder, encode_text
from engine.turn import SHIPPED_TURNS, context, count_turns, load_turns, write_turns

CALLS = [
    "my order number is | two six oh | four four one",
    "my order number is | one one two | nine nine eight",
    "my order number is | five five | one two three four",
    "that's all",
    "that's all thanks",
    "um | i would like to pay my bill",
    "yes",
]


def table():
    return count_turns([[stretch.split() for stretch in call.split("|")] for call in CALLS])


def test_a_digit_run_is_one_token_and_short_turns_start_at_bos():
    assert context("my number is two oh six".split(), 2) == ("is", "#3")
    assert context("two oh six".split(), 3) == ("<s>", "#3")
    assert context("yes".split(), 3) == ("<s>", "yes")
    assert context("yes".split(), 0) == ()


def test_counts_tell_an_open_turn_from_a_finished_one():
    turns = table()
    assert turns.probability("my order number is".split()) < 0.2
    assert turns.probability("my order number is two six oh".split()) < 0.3, "three of six digits"
    assert turns.probability("my order number is three four five six seven eight".split()) > 0.7
    assert turns.probability("that's all".split()) > 0.6
    assert turns.probability("um".split()) < turns.probability([]), "a filler leaves the turn open"
    inside, end = turns.probability("um i would like to".split()), turns.probability("um i would like to pay my bill".split())
    assert inside < turns.probability([]) < end, "a word inside speech counts as a little pause that went on"


def test_an_unseen_context_backs_off_to_what_is_known():
    turns = table()
    prior = turns.probability([])
    assert 0 < prior < 1
    assert turns.probability("zebra".split()) == pytest.approx(prior)


def test_the_table_survives_a_round_trip(tmp_path):
    turns, path = table(), tmp_path / "turns.json.gz"
    assert write_turns(turns, path) == len(turns.counts)
    again = load_turns(path)
    for call in CALLS:
        words = call.replace("|", " ").split()
        assert again.probability(words) == pytest.approx(turns.probability(words), abs=1e-6)


def test_a_broken_table_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="bad.json.gz"):
        load_turns(path)
    with gzip.open(path, "wt") as f:
        f.write('{"order": 3}')
    with pytest.raises(ValueError, match="not a turn-completion table"):
        load_turns(path)
    with pytest.raises(FileNotFoundError):
        load_turns(tmp_path / "missing.json.gz")


def test_every_stream_shares_one_copy_of_a_table_however_it_is_named():
    # a stream's TurnReader asks for load_turns(), the engine for load_turns(SHIPPED_TURNS):
    # read twice, the second read (~0.5 s) fell on the event loop as the first call opened
    relative = Path(os.path.relpath(SHIPPED_TURNS))
    assert load_turns() is load_turns(SHIPPED_TURNS) is load_turns(relative)


def test_the_shipped_table_knows_the_contact_center():
    turns = load_turns()
    assert turns.probability("my order number is".split()) < 0.05
    assert turns.probability("my phone number is two oh six five five five".split()) < 0.2, "6 of 10 digits"
    assert turns.probability("my phone number is two oh six five five five one two three four".split()) > 0.6
    assert turns.probability("yes".split()) > 0.3, "a bare yes is a whole answer"


SPEECH, SURE_END = (0.9, 0.1, 0.0), (0.02, 0.02, 0.96)


def speak_then_pause(decoder: StreamDecoder, words: str, pause_frames: int) -> list:
    """Each letter one frame (a blank between repeats), then frames where the head is 96 %
    sure the turn ended; returns the events of the pause."""
    last = None
    for token in encode_text(words):
        if token == last:
            decoder.on_frame(BLANK, SPEECH)
        decoder.on_frame(token, SPEECH)
        last = token
    return [e for _ in range(pause_frames) for e in decoder.on_frame(BLANK, SURE_END)]


def test_the_head_alone_ends_a_turn_at_its_threshold():
    events = speak_then_pause(StreamDecoder(), "my order number is", 3)
    assert [type(e) for e in events] == [Final, EndOfTurn]


def test_an_unfinished_sentence_holds_the_turn_open_through_a_pause():
    decoder = StreamDecoder(turns=table())
    assert speak_then_pause(decoder, "my order number is", SILENT_TURN_END_FRAMES - 1) == []
    assert speak_then_pause(decoder, " two six oh", SILENT_TURN_END_FRAMES - 1) == [], "3 of 6 digits"
    events = speak_then_pause(decoder, " four four one", 8)
    assert [type(e) for e in events] == [Final, EndOfTurn]
    assert events[0].text == "my order number is two six oh four four one" and events[1].confidence >= 0.98


def test_a_finished_sentence_ends_the_turn_after_a_short_quiet():
    events = speak_then_pause(StreamDecoder(turns=table()), "that's all", 8)
    assert [type(e) for e in events] == [Final, EndOfTurn]
    assert events[0].text == "that's all"


def test_long_silence_still_ends_an_unfinished_turn():
    events = speak_then_pause(StreamDecoder(turns=table()), "um", SILENT_TURN_END_FRAMES + 2)
    assert [type(e) for e in events] == [Final, EndOfTurn], "a caller who stopped mid-sentence is answered"


def test_a_long_turn_is_judged_by_its_end_not_as_a_short_one():
    digits = ["four"] * 16
    said = "my card number is".split() + digits
    assert context(said, 3) == ("number", "is", "#12"), "no sentence start inside a long turn"
    # A bare string of digits is a whole answer; after "my card number is" the caller goes on.
    turns = count_turns([[digits]] * 5 + [[said, ["thanks"]]] * 5)
    assert turns.probability(digits) > 0.7
    assert turns.probability(said) < 0.3


def test_speech_soon_after_a_turn_end_is_judged_as_going_on_with_that_turn():
    # Three digits alone answer a question; after "my order number is" they are half a number.
    turns = count_turns([[stretch.split() for stretch in call.split("|")] for call in CALLS] + [["two six oh".split()]] * 4)
    assert turns.probability("two six oh".split()) > 0.6 > 0.4 > turns.probability("my order number is two six oh".split())

    def digits_after_a_turn_end(quiet_between: int) -> list:
        decoder = StreamDecoder(turns=turns)
        ended = speak_then_pause(decoder, "my order number is", SILENT_TURN_END_FRAMES)
        assert [type(e) for e in ended] == [Final, EndOfTurn], "the silence fallback ends it"
        for _ in range(quiet_between):
            assert decoder.on_frame(BLANK, SURE_END) == []
        return speak_then_pause(decoder, "two six oh", 8)

    assert digits_after_a_turn_end(0) == [], "the caller paused and went on: the number is not finished"
    events = digits_after_a_turn_end(CONTINUATION_FRAMES + 1)
    assert [type(e) for e in events] == [Final, EndOfTurn], "a new turn, answered in three digits"
    assert events[0].text == "two six oh", "the transcript is this turn's alone"


def test_the_turn_end_probability_is_the_callers_to_choose():
    # the head is 96 % sure: a threshold above that waits for the silence fallback
    assert speak_then_pause(StreamDecoder(turn_end_probability=0.97), "my order number is", 8) == []
    events = speak_then_pause(StreamDecoder(turn_end_probability=0.95), "my order number is", 3)
    assert [type(e) for e in events] == [Final, EndOfTurn]
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="turn_end_probability"):
            StreamDecoder(turn_end_probability=bad)
