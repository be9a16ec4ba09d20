"""The dialog's data: the turns of one conversation and the reply being spoken.

This is the gateway's domain core. The conversation loop writes it, the responders read it,
and the session store (gateway/sessions/) keeps it. So it holds plain data and imports
nothing about storage, networking or audio (tests/test_layout.py keeps it that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Turn:
    """One finished turn. For the assistant, `heard_text` is what was played before a barge-in."""

    role: str  # "user" | "assistant"
    text: str
    heard_text: Optional[str] = None


@dataclass
class PendingTurn:
    """The assistant turn being spoken: its full text and how much of it has been played."""

    text: str
    played_ms: int = 0
    heard_text: str = ""  # the words played so far: a resumed session continues after them
    turn: int = 0  # its `turn` in the events (a resumed session goes on under the same number; 0: unknown)


History = list[Turn]  # oldest first; what a responder is given to answer the last user turn


def history_from_dicts(turns: list[dict[str, Any]]) -> History:
    """A history as JSON decoding gives it (each turn a dict of its fields)."""
    return [Turn(**turn) for turn in turns]


def pending_from_dict(data: Optional[dict[str, Any]]) -> Optional[PendingTurn]:
    return PendingTurn(**data) if data is not None else None
