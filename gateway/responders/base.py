"""The responder interface: conversation history in, text deltas (and actions) out.

The conversation loop calls `respond(history)` once per caller turn and speaks each text
delta (a `str`) as it arrives (streaming TTS). An action (`Handoff`, `EndCall`) comes after
the text to be spoken before it; the loop performs it once that text has played. Iterate with
`contextlib.aclosing` so that cancelling the turn (barge-in, hang-up) closes the stream at
once: no orphan tasks, no open HTTP responses.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import AsyncIterator, ClassVar, Sequence, Union

from ..dialog import Turn


@dataclass(frozen=True)
class Handoff:
    """Transfer the caller to a person (the gateway emits a `handoff` event; a SIP call is
    transferred to `target`, or to sip_transfer_target when this names none)."""

    reason: str = ""
    target: str = ""  # a SIP URI (sip:agent@pbx.example.com), or empty for the configured default
    kind: ClassVar[str] = "handoff"


@dataclass(frozen=True)
class EndCall:
    """Hang up once the reply has been spoken."""

    reason: str = ""
    kind: ClassVar[str] = "end_call"


Action = Union[Handoff, EndCall]
Delta = Union[str, Handoff, EndCall]  # a str is the next piece of text to speak


class ResponderError(Exception):
    """The responder failed or timed out. The message is safe to log and to put in an
    `error` event: it names the responder and the problem, never a secret or the caller's words.
    """

    def __init__(self, message: str, code: str = "responder_failed") -> None:
        super().__init__(message)
        self.code = code  # responder_timeout | responder_unreachable | responder_http_error | responder_bad_reply | ...

    @property
    def message(self) -> str:
        return str(self)


class Responder(ABC):
    """One per call: it may keep the call's state (a scripted flow's pending slot)."""

    name = "responder"

    async def start(self) -> AsyncIterator[Delta]:
        """What to say when the call connects, before the caller speaks; nothing by default."""
        return
        yield  # pragma: no cover - makes this an async generator

    @abstractmethod
    def respond(self, history: Sequence[Turn]) -> AsyncIterator[Delta]:
        """The reply to the last user turn of `history` (oldest first), as it is produced."""

    async def aclose(self) -> None:
        """Release what the responder holds (an HTTP session it opened); idempotent."""

    async def __aenter__(self) -> "Responder":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def spoken_text(turn: Turn) -> str:
    """What was actually said in a turn: for an interrupted assistant turn, only what was heard."""
    if turn.role == "assistant" and turn.heard_text is not None:
        return turn.heard_text
    return turn.text


def last_user_text(history: Sequence[Turn]) -> str:
    for turn in reversed(history):
        if turn.role == "user":
            return turn.text
    return ""


def chat_messages(history: Sequence[Turn]) -> list[dict[str, str]]:
    """History as Chat Completions messages; turns nobody heard (barged in at once) are left out."""
    messages = []
    for turn in history:
        text = spoken_text(turn).strip()
        if text and turn.role in ("user", "assistant"):
            messages.append({"role": turn.role, "content": text})
    return messages


async def collect(deltas: AsyncIterator[Delta]) -> list[Delta]:
    """Every delta of a reply (tests, non-streaming callers); closes the stream either way."""
    async with contextlib.aclosing(deltas) as stream:
        return [delta async for delta in stream]
