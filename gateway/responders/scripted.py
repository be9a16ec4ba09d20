"""The scripted responder: a flow file's intents, slots and branches, no model or network.

Per call it keeps where the conversation is (intent, pending slot, filled slots, misses).
That state follows from the caller's words alone, so when the history does not continue
what this responder has seen (the call resumed on another node), it is rebuilt by replaying
the caller's earlier turns.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from ..dialog import Turn
from .base import Delta, EndCall, Handoff, Responder
from .flow import PLACEHOLDER, SWITCH_SCORE, Flow, Intent, Outcome, Slot
from .spoken import parse_date, parse_digits, parse_yes_no, read_date, read_digits


@dataclass
class FlowState:
    intent: Optional[str] = None  # the intent being served
    slot: int = 0  # index of the pending slot in the intent
    filled: dict[str, Any] = field(default_factory=dict)
    misses: int = 0  # misunderstood answers to the pending slot


def parse_slot(slot: Slot, text: str, today: dt.date) -> Any:
    """The slot's value in the caller's text, or None when it is not there."""
    if slot.type == "digits":
        digits = parse_digits(text)
        return digits if digits and slot.min_digits <= len(digits) <= slot.max_digits else None
    if slot.type == "date":
        return parse_date(text, today)
    return parse_yes_no(text)


def read_value(value: Any) -> str:
    """A slot value as it is read back: digits one at a time, dates in full, yes or no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dt.date):
        return read_date(value)
    return read_digits(str(value))


def render(text: str, filled: dict[str, Any]) -> str:
    return PLACEHOLDER.sub(lambda m: read_value(filled[m.group(1)]), text)


class FlowRunner:
    """The flow's state machine for one call: one caller utterance in, what to say and do out."""

    def __init__(self, flow: Flow, today: Callable[[], dt.date] = dt.date.today) -> None:
        self.flow, self.today, self.state = flow, today, FlowState()

    def step(self, text: str) -> list[Delta]:
        state = self.state
        if state.intent is not None:
            intent = self.flow.intent(state.intent)
            slot = intent.slots[state.slot]
            value = parse_slot(slot, text, self.today())
            if value is not None:
                state.filled[slot.name], state.slot, state.misses = value, state.slot + 1, 0
                return self._advance(intent)
            other = self.flow.match(text, SWITCH_SCORE)
            if other is not None and other.name != intent.name:  # "actually, talk to a person"
                return self._begin(other, text)
            state.misses += 1
            if state.misses > slot.max_reprompts:
                self.state = FlowState()
                return self._say(slot.give_up or self.flow.fallback, intent, state.filled)
            return [render(slot.reprompt, state.filled)]
        intent = self.flow.match(text)
        if intent is None:
            return self._say(self.flow.fallback, None, {})
        return self._begin(intent, text)

    def _begin(self, intent: Intent, text: str) -> list[Delta]:
        self.state = FlowState(intent=intent.name)
        first = intent.slots[0] if intent.slots else None
        if first is not None and first.type != "yes_no":  # "where is order four one two seven"
            value = parse_slot(first, text, self.today())
            if value is not None:
                self.state.filled[first.name], self.state.slot = value, 1
        return self._advance(intent)

    def _advance(self, intent: Intent) -> list[Delta]:
        state = self.state
        if state.slot < len(intent.slots):
            return [render(intent.slots[state.slot].prompt, state.filled)]
        filled = state.filled
        self.state = FlowState()
        outcome = next((b.outcome for b in intent.branches
                        if all(filled.get(k) == v for k, v in b.when.items())), intent.outcome)
        return self._say(outcome, intent, filled)

    @staticmethod
    def _say(outcome: Outcome, intent: Optional[Intent], filled: dict[str, Any]) -> list[Delta]:
        deltas: list[Delta] = [render(outcome.reply, filled)]
        reason = outcome.reason or (intent.name if intent else "")
        if outcome.action == "handoff":
            deltas.append(Handoff(reason, outcome.transfer))
        elif outcome.action == "end_call":
            deltas.append(EndCall(reason))
        return deltas


class ScriptedResponder(Responder):
    name = "scripted"

    def __init__(self, flow: Flow, today: Callable[[], dt.date] = dt.date.today) -> None:
        self.flow, self.today = flow, today
        self._runner = FlowRunner(flow, today)
        self._seen: list[str] = []  # the caller's turns the runner's state reflects

    async def start(self) -> AsyncIterator[Delta]:
        if self.flow.greeting:
            yield self.flow.greeting

    async def respond(self, history: Sequence[Turn]) -> AsyncIterator[Delta]:
        said = [turn.text for turn in history if turn.role == "user"]
        if not said:
            yield self.flow.fallback.reply
            return
        if said[:-1] != self._seen:  # resumed elsewhere, or a turn was retried: replay
            self._runner = FlowRunner(self.flow, self.today)
            for text in said[:-1]:
                self._runner.step(text)
        deltas = self._runner.step(said[-1])
        self._seen = said
        for delta in deltas:
            yield delta
