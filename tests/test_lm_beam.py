"""The word language model (engine/lm.py) and the CTC prefix beam search (engine/beam.py)."""

import gzip
import math

import numpy as np
import pytest

from engine.beam import CtcBeamSearch
from engine.lm import BOS, EOS, load_lm, read_arpa, write_arpa
from engine.stt import BLANK, VOCAB, GreedyCtc, StreamDecoder, frame_outputs

SENTENCES = ["i want to pay my bill", "please pay my bill today", "my bill is wrong",
             "i want to talk to an agent", "my name is sue", "the pill is blue"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "small.arpa.gz"
    counts = write_arpa(SENTENCES, path)
    assert counts["1-grams"] > 10 and counts["3-grams"] > 10
    return read_arpa(path)


def test_probabilities_sum_to_one_in_seen_and_unseen_contexts(lm):
    words = lm.vocabulary | {EOS}
    for context in [(BOS,), (BOS, "my"), ("pay", "my"), ("agent", "blue"), ("never", "seen")]:
        total = sum(math.exp(lm.log_prob(context, w)) for w in words)
        assert total == pytest.approx(1.0, abs=1e-3), context
    assert lm.log_prob(("pay", "my"), "bill") > lm.log_prob(("pay", "my"), "pill")
    assert lm.log_prob((BOS,), "zebra") < lm.log_prob((BOS,), "agent")  # unknown words cost most
    assert lm.known_prefix("bilx") == 3 and lm.known_prefix("xyz") == 0


def test_malformed_arpa_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.arpa"
    path.write_text("\\data\\\nngram 1=2\n\n\\1-grams:\n-1.0\thello\n-1.0 a b c d\n")
    with pytest.raises(ValueError, match="bad.arpa:6"):
        read_arpa(path)
    empty = tmp_path / "empty.arpa.gz"
    with gzip.open(empty, "wt") as f:
        f.write("\\data\\\n\\end\\\n")
    with pytest.raises(ValueError, match="no n-grams"):
        read_arpa(empty)


def frames_for(spelling: list[dict[str, float]]) -> list[list[tuple[int, float]]]:
    """Frames from per-letter distributions, each letter followed by a blank frame."""
    frames = []
    for letters in spelling:
        probs = np.full(len(VOCAB), 1e-4)
        for ch, p in letters.items():
            probs[VOCAB.index(ch)] = p
        probs /= probs.sum()
        frames.append([(i, float(np.log(p))) for i, p in enumerate(probs)])
        blank = np.full(len(VOCAB), 1e-4)
        blank[BLANK] = 1.0
        blank /= blank.sum()
        frames.append([(i, float(np.log(p))) for i, p in enumerate(blank)])
    return frames


def sure(text: str) -> list[dict[str, float]]:
    return [{ch: 0.95} for ch in text]


def test_the_language_model_settles_what_the_acoustics_leave_open(lm):
    # "pay my ?ill": the acoustics lean to "p" (0.55 vs 0.45); the words around say "bill".
    spelling = sure("pay my ") + [{"p": 0.55, "b": 0.45}] + sure("ill")
    frames = frames_for(spelling)
    greedy = GreedyCtc()
    for t, frame in enumerate(frames):
        greedy.push(max(frame, key=lambda c: c[1])[0], t)
    assert greedy.text() == "pay my pill"
    beam = CtcBeamSearch(lm, VOCAB, BLANK)
    for t, frame in enumerate(frames):
        beam.push(frame, t)
    words, spans = beam.best()
    assert words == ["pay", "my", "bill"]
    # each word spans the frames of its letters (every letter is followed by one blank frame)
    assert spans == [(0, 4), (8, 10), (14, 20)]


def test_without_the_language_model_the_beam_agrees_with_greedy(lm):
    frames = frames_for(sure("the pill is blue"))
    beam = CtcBeamSearch(lm, VOCAB, BLANK, lm_weight=0.0, word_bonus=0.0)
    for t, frame in enumerate(frames):
        beam.push(frame, t)
    assert beam.best()[0] == ["the", "pill", "is", "blue"]


def test_unknown_words_stay_possible(lm):
    frames = frames_for(sure("my name is zoltan"))
    beam = CtcBeamSearch(lm, VOCAB, BLANK)
    for t, frame in enumerate(frames):
        beam.push(frame, t)
    assert beam.best()[0] == ["my", "name", "is", "zoltan"]


def test_stream_decoder_finals_come_from_the_beam(lm):
    import torch

    decoder = StreamDecoder(lm)
    spelling = sure("pay my ") + [{"p": 0.55, "b": 0.45}] + sure("ill")
    events = []
    for frame in frames_for(spelling):
        logits = torch.full((1, len(VOCAB)), -50.0)
        for token, lp in frame:
            logits[0, token] = lp
        token, _, candidates = frame_outputs(logits, torch.zeros(1, 3))[0]
        events += decoder.on_frame(token, [0.05, 0.9, 0.05], candidates)  # "pause": no turn end yet
    final = decoder.flush()[0]
    assert final.text == "pay my bill"
    assert [w for w, _, _ in final.words] == ["pay", "my", "bill"]
    partials = [e.text for e in events if hasattr(e, "text")]
    assert partials[0] == "p" and partials[-1] == "pay my bill"  # the first letter at once, then the beam's best


def test_the_shipped_language_model_loads_and_knows_the_domain():
    lm = load_lm()
    assert lm.order == 3 and len(lm.vocabulary) > 5000
    assert lm.log_prob((BOS, "my", "order"), "number") > math.log(0.05)


def test_best_is_remembered_only_while_the_ranking_cannot_change(lm):
    frames = frames_for(sure("pay my ") + [{"p": 0.55, "b": 0.45}] + sure("ill"))
    beam = CtcBeamSearch(lm, VOCAB, BLANK)
    blank_only = [(BLANK, math.log(0.999)), (VOCAB.index("a"), math.log(0.0005))]  # no letter over the floor
    for t, frame in enumerate(frames):
        beam.push(frame, t)
        remembered = beam.best()
        assert remembered == beam._rank_best(), "a letter frame ranks anew"
        beam.push(blank_only, t)
        assert beam.best() == remembered == beam._rank_best(), "a blank moves every hypothesis alike"
    beam.best()[0].append("mutated")
    assert beam.best()[0] == ["pay", "my", "bill"], "callers get copies"
