"""Key presses as caller turns: DTMF digits (SIP calls) gathered into one turn of text.

An IVR caller types "1", or an account number and `#`. Each key is an event at once; the
keys together become one caller turn, handed to the responder like spoken words, when the
caller presses `#` or stops typing for KEY_PAUSE_S. `*` and `#` are keys too: `#` only
ends the turn, `*` is kept (a flow may give it a meaning).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

KEY_PAUSE_S = 2.0  # a pause this long after a key ends the typed turn (a person types a digit a second or faster)
END_KEY = "#"
MAX_KEYS = 32  # a turn this long is ended at once: nobody types more, and a stuck key must not grow it forever


class KeyTurns:
    """Collects keys; calls `on_turn(keys)` when a typed turn is complete."""

    def __init__(self, on_turn: Callable[[str], None], pause_s: float = KEY_PAUSE_S) -> None:
        self._on_turn = on_turn
        self._pause_s = pause_s
        self._keys: list[str] = []
        self._timer: Optional[asyncio.TimerHandle] = None

    @property
    def pending(self) -> str:
        return "".join(self._keys)

    def press(self, key: str) -> None:
        self._cancel_timer()
        if key != END_KEY:
            self._keys.append(key)
        if key == END_KEY or len(self._keys) >= MAX_KEYS:
            self._finish()
        else:
            self._timer = asyncio.get_running_loop().call_later(self._pause_s, self._finish)

    def _finish(self) -> None:
        self._cancel_timer()
        keys, self._keys = "".join(self._keys), []
        if keys:
            self._on_turn(keys)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self._cancel_timer()
        self._keys = []
