"""The echo responder: says back what the caller said (a diagnostic, and the loop's test double)."""

from __future__ import annotations

from typing import AsyncIterator, Sequence

from ..dialog import Turn
from .base import Delta, Responder, last_user_text


class EchoResponder(Responder):
    name = "echo"

    async def respond(self, history: Sequence[Turn]) -> AsyncIterator[Delta]:
        said = last_user_text(history).strip()
        yield f"You said: {said}" if said else "I didn't hear anything."
