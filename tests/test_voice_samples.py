"""The voice samples people can listen to: every one the demo page plays is a short WAV of
speech in static/voice/ (served at /static/voice/), and the README links each of them."""

import re
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def test_demo_page_samples_are_short_speech_and_linked_from_the_readme():
    sources = re.findall(r'<audio controls preload="none" src="/static/(voice/[\w-]+\.wav)"', (ROOT / "web/index.html").read_text())
    readme = (ROOT / "README.md").read_text()
    assert len(sources) >= 3
    for source in sources:
        path = ROOT / "static" / source
        with wave.open(str(path), "rb") as f:
            rate, audio = f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), "<i2")
        assert rate == 22050 and 1.0 < len(audio) / rate < 8.0 and path.stat().st_size < 400_000
        frames = audio[: len(audio) // 1024 * 1024].reshape(-1, 1024).astype(np.float64)
        loud = np.sqrt((frames ** 2).mean(axis=1)) > 300
        assert loud.mean() > 0.4  # mostly speech, not silence
        assert f"static/{source}" in readme
