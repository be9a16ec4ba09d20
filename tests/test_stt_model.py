"""engine.stt: streaming features and model steps equal the offline path; events are well-formed."""

import numpy as np
import pytest
import torch

from engine.audio import N_FFT, HOP_LENGTH, StreamingLogMel, log_mel, stack_frames
from engine.interface import EndOfTurn, Final, Partial, SpeechLikely, SpeechStart
from engine.stt import (BLANK, SILENT_TURN_END_FRAMES, WORDLESS_END_FRAMES, GreedyCtc, Recognizer, StreamDecoder, SttConfig, SttModel,
                        VOCAB, encode_text, transcribe)


def test_streaming_log_mel_equals_offline():
    rng = np.random.default_rng(0)
    audio = torch.from_numpy(rng.normal(0, 0.1, 16000 * 2).astype(np.float32))
    offline = log_mel(audio)
    stream, pieces, start = StreamingLogMel(), [], 0
    while start < len(audio):
        size = int(rng.integers(1, 900))
        pieces.append(stream.push(audio[start:start + size]))
        start += size
    streamed = torch.cat(pieces)
    assert offline.shape == (1 + (len(audio) - N_FFT) // HOP_LENGTH, 80)
    assert streamed.shape == offline.shape
    assert torch.allclose(streamed, offline, atol=1e-5)


def test_model_step_equals_forward():
    torch.manual_seed(0)
    model = SttModel(SttConfig(width=48, depth=2)).eval()
    audio = torch.randn(16000) * 0.1
    stacked = stack_frames(log_mel(audio)).unsqueeze(0)
    with torch.no_grad():
        ctc, eot, _ = model(stacked)
        state = model.initial_state(1)
        for t in range(stacked.shape[1]):
            c, e, state = model.step(stacked[:, t], state)
            assert torch.allclose(c, ctc[:, t], atol=1e-4) and torch.allclose(e, eot[:, t], atol=1e-4)


def test_greedy_ctc_text_and_word_times():
    decoder = GreedyCtc()
    ids = encode_text("hi yo")
    sequence = [0, ids[0], ids[0], 0, ids[1], ids[2], ids[3], ids[3], 0, ids[4], 0]
    for frame, token in enumerate(sequence):
        decoder.push(token, frame)
    assert decoder.text() == "hi yo"
    (w1, s1, e1), (w2, s2, e2) = decoder.words()
    assert (w1, w2) == ("hi", "yo") and s1 < e1 <= s2 < e2


SPEECH_FRAME, QUIET_FRAME = (0.9, 0.1, 0.0), (0.05, 0.9, 0.05)


def test_silence_after_words_ends_the_turn_when_the_head_is_unsure():
    decoder = StreamDecoder()
    decoder.on_frame(BLANK, SPEECH_FRAME)
    decoder.on_frame(encode_text("o")[0], SPEECH_FRAME)
    events = [decoder.on_frame(BLANK, QUIET_FRAME) for _ in range(SILENT_TURN_END_FRAMES)]
    assert all(e == [] for e in events[:-1]), "a mid-turn pause is not the end"
    assert [type(e) for e in events[-1]] == [Final, EndOfTurn]


def test_a_sure_speech_frame_starts_speech_before_any_character():
    decoder = StreamDecoder()
    assert decoder.on_frame(BLANK, (0.4, 0.6, 0.0)) == [], "an unsure frame starts nothing"
    (start,) = decoder.on_frame(BLANK, (0.95, 0.05, 0.0))
    assert isinstance(start, SpeechStart) and start.t == pytest.approx(0.04)


def test_a_leaning_frame_reports_likely_speech_once_per_sound():
    decoder = StreamDecoder()
    leaning, unsure, quiet = (0.85, 0.15, 0.0), (0.6, 0.4, 0.0), (0.3, 0.7, 0.0)
    (likely,) = decoder.on_frame(BLANK, leaning)
    assert isinstance(likely, SpeechLikely) and likely.probability == pytest.approx(0.85)
    assert decoder.on_frame(BLANK, leaning) == [] and decoder.on_frame(BLANK, unsure) == [], "once per sound"
    assert decoder.on_frame(BLANK, quiet) == []
    (again,) = decoder.on_frame(BLANK, leaning)
    assert isinstance(again, SpeechLikely), "a new sound after the head fell back"
    (start,) = decoder.on_frame(BLANK, (0.95, 0.05, 0.0))
    assert isinstance(start, SpeechStart), "certainty still starts speech"
    assert decoder.on_frame(BLANK, quiet) == [] and decoder.on_frame(BLANK, leaning) == [], "none within speech"


def test_a_first_token_reports_likely_speech_before_the_head_is_sure():
    decoder = StreamDecoder()
    (likely,) = decoder.on_frame(encode_text(" ")[0], (0.3, 0.5, 0.2))
    assert isinstance(likely, SpeechLikely), "the word boundary a recognizer emits at a word's onset"
    events = decoder.on_frame(encode_text("a")[0], (0.3, 0.5, 0.2))
    assert not any(isinstance(e, SpeechLikely) for e in events), "once per sound"


def test_a_sure_frame_starts_speech_without_a_likely_first():
    decoder = StreamDecoder()
    assert [type(e) for e in decoder.on_frame(BLANK, (0.95, 0.05, 0.0))] == [SpeechStart]


def test_a_wordless_sound_closes_without_a_final():
    decoder = StreamDecoder()
    decoder.on_frame(BLANK, (0.95, 0.05, 0.0))
    events = [decoder.on_frame(BLANK, QUIET_FRAME) for _ in range(WORDLESS_END_FRAMES)]
    assert all(e == [] for e in events[:-1])
    assert [type(e) for e in events[-1]] == [EndOfTurn] and events[-1][0].confidence == 0.0
    (start,) = decoder.on_frame(BLANK, (0.95, 0.05, 0.0))
    assert isinstance(start, SpeechStart), "the next sound starts a new one"


def test_recognizer_streams_events_without_crashing_on_odd_audio():
    torch.manual_seed(0)
    model = SttModel(SttConfig(width=32, depth=1))
    recognizer = Recognizer(model)
    events = []
    for chunk in [np.zeros(0, np.int16), np.zeros(333, np.int16), (np.random.default_rng(1).normal(0, 3000, 16000)).astype(np.int16),
                  np.full(8000, 32767, np.int16), np.zeros(16000 * 10, np.int16)]:
        events += recognizer.push(chunk)
    events += recognizer.flush()
    assert all(isinstance(e, (Partial, Final, SpeechLikely, SpeechStart, EndOfTurn)) for e in events)
    with pytest.raises(ValueError):
        recognizer.push(np.array([np.nan], dtype=np.float32))
    assert isinstance(transcribe(model, np.zeros(100, np.int16)), str)


def test_checkpoint_choices_never_look_at_the_blind_voices():
    from engine.train.train_stt import BLIND_FOLDERS, selection_wer

    results = {"flite_slt": 0.4, "kokoro_mix_heldout": 0.2, **{name: 0.0 for name in BLIND_FOLDERS}}
    assert selection_wer(results) == pytest.approx(0.3)


def test_fine_tune_starts_from_the_given_weights_at_their_size(tmp_path):
    from engine import weights
    from engine.train.train_stt import SETTINGS, new_model

    trained = SttModel(SttConfig(width=32, depth=1))
    path = tmp_path / "small.safetensors"
    weights.save(trained, trained.config_dict(), path, {})
    model = new_model({**SETTINGS, "init_from": str(path)})  # the recipe's own width/depth are larger
    assert model.config_dict() == trained.config_dict()
    for (name, value), (_, start) in zip(trained.state_dict().items(), model.state_dict().items()):
        assert torch.equal(value, start), name
    assert all(p.requires_grad for p in model.parameters())
    assert new_model(SETTINGS).config_dict()["width"] == SETTINGS["width"]


def test_an_end_of_turn_teacher_pulls_the_head_towards_its_probabilities():
    """Taught by a copy of itself, the end-of-turn loss has nothing left to teach (zero
    gradient on the head); taught by another model, or by the labels alone, it has."""
    import copy

    from engine.train.train_stt import SETTINGS, collate, losses

    torch.manual_seed(0)
    model = SttModel(SttConfig(width=32, depth=1))
    rng = np.random.default_rng(0)
    batch = collate([{"audio": rng.normal(0, 0.1, 16000).astype(np.float32), "text": "yes",
                      "eot": rng.integers(0, 3, 25).astype(np.int8)} for _ in range(2)], torch.device("cpu"))

    def head_gradient(teacher, weight):
        model.zero_grad()
        _, eot_loss = losses(model, batch, {**SETTINGS, "eot_teacher_weight": weight}, teacher)
        eot_loss.backward()
        return float(model.eot_head.weight.grad.abs().max())

    assert head_gradient(copy.deepcopy(model).eval(), 1.0) < 1e-6
    assert head_gradient(SttModel(SttConfig(width=32, depth=1)).eval(), 1.0) > 1e-4
    assert head_gradient(None, 1.0) > 1e-4  # no teacher: the labels
