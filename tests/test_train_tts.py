"""The TTS trainer's model growth: a grown decoder starts as the trained one and then learns."""

import pytest
import torch

from engine.train.train_tts import grow_decoder, new_model
from engine.tts import TtsConfig, TtsModel


def _small_model() -> TtsModel:
    torch.manual_seed(0)
    return TtsModel(TtsConfig(width=32, encoder_depth=1, decoder_depth=2, mlp_ratio=2, lookahead=2)).eval()


def _batch():
    ids = torch.randint(1, 100, (2, 9))
    durations = torch.randint(1, 5, (2, 9))
    return ids, durations


def test_grown_decoder_speaks_as_the_trained_one_then_learns():
    model = _small_model()
    ids, durations = _batch()
    grown = grow_decoder(model, 2)
    assert grown.config.decoder_depth == 4 and len(grown.decoder.blocks) == 4
    with torch.no_grad():
        before, after = model(ids, durations), grown(ids, durations)
    torch.testing.assert_close(after[1], before[1])
    torch.testing.assert_close(after[0], before[0])

    optimizer = torch.optim.SGD(grown.decoder.blocks[2:].parameters(), lr=0.1)
    grown.train()
    grown(ids, durations)[1].pow(2).mean().backward()
    optimizer.step()
    with torch.no_grad():
        assert not torch.allclose(grown(ids, durations)[1], before[1])  # the new blocks are live


def test_growing_needs_a_trained_model():
    with pytest.raises(SystemExit, match="init_from"):
        new_model({"init_from": "", "grow_decoder": 2, "width": 32, "encoder_depth": 1, "decoder_depth": 2,
                   "mlp_ratio": 2, "lookahead": 2})


def test_a_decoder_cannot_shrink():
    with pytest.raises(SystemExit, match="only grow"):
        grow_decoder(_small_model(), -1)
