"""Replay a recorded call through the echo suppressor and the recognizer, offline: the same
as `parley replay` (gateway/replay.py), kept under this name because earlier results in
bench/results/ and docs/benchmarks.md cite it.

    .venv/bin/python bench/replay_call.py recordings/20261130T170000-ses_x.wav --json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["replay", *sys.argv[1:]]))
