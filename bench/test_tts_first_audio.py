"""bench/tts_first_audio.py times real replies on a running engine."""

import pytest

from bench.tts_first_audio import first_audio_times
from engine.runtime import SpeechEngine
from engine.tts import SHIPPED_WEIGHTS


@pytest.mark.skipif(not SHIPPED_WEIGHTS.exists(), reason="no engine/weights/tts.safetensors")
async def test_every_reply_is_timed_to_its_first_audio():
    engine = SpeechEngine(with_tts=True)
    engine.start()
    try:
        times = await first_audio_times(engine, ["Sure, one moment.", "Your order ships on Monday."], rounds=1)
    finally:
        engine.close()
    assert len(times) == 2 and all(0 < t < 30 for t in times)
