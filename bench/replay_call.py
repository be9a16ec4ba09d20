"""Replay a recorded call through the echo suppressor and the recognizer, offline
(the code is tests/kit/replay.py, shared with the tests).

    .venv/bin/python bench/replay_call.py recordings/20261130T170000-ses_x.wav --json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.kit.replay import main  # noqa: E402

if __name__ == "__main__":
    main()
