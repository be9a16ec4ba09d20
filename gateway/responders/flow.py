"""Scripted flow files: YAML with a greeting, intents, slots, branches and actions.

    greeting: "Thanks for calling. How can I help?"
    fallback: "Sorry, I can help with orders or opening hours."
    max_reprompts: 2                # misunderstood answers to a slot before giving up on it
    give_up: {reply: "...", action: handoff}   # optional: what giving up says and does
    intents:
      order_status:
        keywords: [order, "where is my"]      # whole words of the caller's text
        patterns: ['track(ing)? (a|my) (order|package)']  # regex, searched in the normalized text
        slots:
          - {name: order_number, type: digits, prompt: "What's the order number?", min_digits: 4}
        reply: "Order {order_number} is on its way."
        branches:                             # optional: the first whose slot values match wins
          - {when: {order_number: "0000"}, reply: "...", action: handoff, reason: "..."}
        action: end_call                      # optional: handoff | end_call
        reason: "caller said goodbye"
      agent:
        dtmf: "0"                             # optional: the caller's keys (a SIP call's DTMF) choose it
        keywords: [agent]
        reply: "Connecting you."
        transfer: sip:agent@pbx.example.com   # optional: a handoff that transfers a SIP call there

The normalized text is lowercase words separated by single spaces, as Parley's STT writes
it. Slot types: digits (value: a string of digits), date (a date), yes_no (true/false; in
YAML `when: {slot: yes}` is true). `{slot}` in a reply or prompt is replaced by its value
read aloud. A digits slot also takes typed keys ("4127"). Errors name the file and the place: "flow file F: intents.x.slots[0]: ...".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from .spoken import normalize

DEFAULT_FLOW = Path(__file__).parent / "flows" / "contact_center.yaml"
SLOT_TYPES = ("digits", "date", "yes_no")
ACTIONS = ("handoff", "end_call")
DEFAULT_MAX_REPROMPTS = 2
MAX_DIGITS = 32  # longest digit slot a flow may ask for
PLACEHOLDER = re.compile(r"\{(\w+)\}")
KEYS = re.compile(r"[0-9*#A-D]+")  # a turn typed on the keypad (DTMF)
PATTERN_SCORE = 3  # a matching pattern counts like a three-word keyword phrase
SWITCH_SCORE = 2  # while a question is pending, one keyword ("no") does not change the subject


class FlowError(ValueError):
    """A flow file Parley cannot run; the message names the file and the problem."""


@dataclass(frozen=True)
class Outcome:
    """What the flow says, then does, when an intent completes (or a slot is given up on)."""

    reply: str
    action: Optional[str] = None  # handoff | end_call
    reason: str = ""
    transfer: str = ""  # a handoff's SIP target (the call is REFERred there)


@dataclass(frozen=True)
class Branch:
    when: dict[str, Any]  # slot name -> value; all must be equal
    outcome: Outcome


@dataclass(frozen=True)
class Slot:
    name: str
    type: str
    prompt: str
    reprompt: str
    max_reprompts: int
    min_digits: int = 1
    max_digits: int = MAX_DIGITS
    give_up: Optional[Outcome] = None


@dataclass(frozen=True)
class Intent:
    name: str
    keywords: tuple[tuple[str, ...], ...]  # each keyword phrase as its words
    patterns: tuple[re.Pattern, ...]
    slots: tuple[Slot, ...]
    branches: tuple[Branch, ...]
    outcome: Outcome
    dtmf: str = ""  # keys that choose this intent outright

    def score(self, text: str) -> int:
        """How well normalized `text` matches: words of matched keywords plus PATTERN_SCORE per pattern."""
        tokens = text.split()
        score = sum(len(k) for k in self.keywords if _contains(tokens, k))
        return score + PATTERN_SCORE * sum(1 for p in self.patterns if p.search(text))


@dataclass(frozen=True)
class Flow:
    path: str
    greeting: str
    fallback: Outcome
    intents: tuple[Intent, ...]

    def match(self, text: str, min_score: int = 1) -> Optional[Intent]:
        """The best matching intent for the caller's text (ties: the first in the file), or None."""
        keys = text.strip()
        if KEYS.fullmatch(keys):
            by_keys = next((intent for intent in self.intents if intent.dtmf == keys), None)
            if by_keys is not None:
                return by_keys
        normalized = normalize(text)
        best, best_score = None, min_score - 1
        for intent in self.intents:
            score = intent.score(normalized)
            if score > best_score:
                best, best_score = intent, score
        return best

    def intent(self, name: str) -> Intent:
        return next(intent for intent in self.intents if intent.name == name)


def _contains(tokens: list[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(tokens[i:i + n]) == phrase for i in range(len(tokens) - n + 1))


# -- loading and validation ------------------------------------------------------------

FLOW_KEYS = {"greeting": False, "fallback": True, "max_reprompts": False, "give_up": False, "intents": True}
INTENT_KEYS = {"keywords": False, "patterns": False, "slots": False, "reply": True, "action": False,
               "reason": False, "branches": False, "dtmf": False, "transfer": False}
SLOT_KEYS = {"name": True, "type": True, "prompt": True, "reprompt": False, "max_reprompts": False,
             "min_digits": False, "max_digits": False, "give_up": False}
OUTCOME_KEYS = {"reply": True, "action": False, "reason": False, "transfer": False}
BRANCH_KEYS = {"when": True, "reply": True, "action": False, "reason": False, "transfer": False}


class _Checker:
    """Reads one flow file's parsed YAML, raising FlowError with the file and the place."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> FlowError:
        return FlowError(f"flow file {self.path}: {where + ': ' if where else ''}{problem}")

    def mapping(self, value: Any, where: str, keys: dict[str, bool]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        unknown = sorted(str(k) for k in value if k not in keys)
        if unknown:
            raise self.fail(where, f"unknown key {unknown[0]!r} (known keys: {', '.join(keys)})")
        missing = [k for k, required in keys.items() if required and k not in value]
        if missing:
            raise self.fail(where, f"missing required key {missing[0]!r}")
        return value

    def text(self, value: Any, where: str) -> str:
        if isinstance(value, bool):
            raise self.fail(where, f"expected text, got {value!r} (quote it: YAML reads yes, no, on, off as booleans)")
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected non-empty text, got {value!r}")
        return value.strip()

    def texts(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list of text, got {type(value).__name__}")
        return [self.text(item, f"{where}[{i}]") for i, item in enumerate(value)]

    def count(self, value: Any, where: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(where, f"expected a whole number in {low}-{high}, got {value!r}")
        return value

    def placeholders(self, text: str, where: str, slots: set[str]) -> str:
        for name in PLACEHOLDER.findall(text):
            if name not in slots:
                known = ", ".join(sorted(slots)) or "none"
                raise self.fail(where, f"{{{name}}} names no slot of this intent (slots: {known})")
        return text

    def outcome(self, raw: Any, where: str, slots: set[str], keys: dict[str, bool] = OUTCOME_KEYS) -> Outcome:
        raw = self.mapping(raw, where, keys)
        action = raw.get("action")
        if action is not None and action not in ACTIONS:
            raise self.fail(f"{where}.action", f"{action!r} is not one of {', '.join(ACTIONS)}")
        reason = self.text(raw["reason"], f"{where}.reason") if "reason" in raw else ""
        reply = self.placeholders(self.text(raw["reply"], f"{where}.reply"), f"{where}.reply", slots)
        transfer = self.text(raw["transfer"], f"{where}.transfer") if "transfer" in raw else ""
        if transfer:
            if not transfer.startswith(("sip:", "sips:", "tel:")):
                raise self.fail(f"{where}.transfer", f"{transfer!r} is not a sip:, sips: or tel: URI")
            if action not in (None, "handoff"):
                raise self.fail(f"{where}.transfer", "a transfer is a handoff; it cannot go with end_call")
            action = "handoff"
        return Outcome(reply, action, reason, transfer)

    def pattern(self, source: Any, where: str) -> re.Pattern:
        try:
            return re.compile(self.text(source, where), re.IGNORECASE)
        except re.error as exc:
            raise self.fail(where, f"bad regex {source!r} ({exc})") from None

    def slot(self, raw: Any, where: str, earlier: set[str], max_reprompts: int) -> Slot:
        raw = self.mapping(raw, where, SLOT_KEYS)
        name = self.text(raw["name"], f"{where}.name")
        if not re.fullmatch(r"\w+", name) or name in earlier:
            raise self.fail(f"{where}.name", f"{name!r} must be one word and unique in its intent")
        kind = raw["type"]
        if kind not in SLOT_TYPES:
            raise self.fail(f"{where}.type", f"{kind!r} is not one of {', '.join(SLOT_TYPES)}")
        prompt = self.placeholders(self.text(raw["prompt"], f"{where}.prompt"), f"{where}.prompt", earlier)
        reprompt = raw.get("reprompt", f"Sorry, I didn't catch that. {prompt}")
        reprompt = self.placeholders(self.text(reprompt, f"{where}.reprompt"), f"{where}.reprompt", earlier)
        limit = self.count(raw.get("max_reprompts", max_reprompts), f"{where}.max_reprompts", 0, 10)
        low = self.count(raw.get("min_digits", 1), f"{where}.min_digits", 1, MAX_DIGITS)
        high = self.count(raw.get("max_digits", MAX_DIGITS), f"{where}.max_digits", low, MAX_DIGITS)
        if kind != "digits" and ("min_digits" in raw or "max_digits" in raw):
            raise self.fail(where, "min_digits and max_digits are for digits slots only")
        give_up = self.outcome(raw["give_up"], f"{where}.give_up", earlier) if "give_up" in raw else None
        return Slot(name, kind, prompt, reprompt, limit, low, high, give_up)

    def when(self, raw: Any, where: str, slots: dict[str, Slot]) -> dict[str, Any]:
        if not isinstance(raw, dict) or not raw:
            raise self.fail(where, "expected a mapping of slot names to values")
        out = {}
        for name, value in raw.items():
            slot = slots.get(name)
            if slot is None:
                raise self.fail(where, f"{name!r} is not a slot of this intent")
            if slot.type == "digits" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # YAML reads 1234 as a number; quote values with leading zeros
            expected = {"digits": str, "yes_no": bool, "date": dt.date}[slot.type]
            if not isinstance(value, expected):
                raise self.fail(f"{where}.{name}", f"expected a {slot.type} value, got {value!r}")
            out[name] = value
        return out

    def intent(self, name: Any, raw: Any, max_reprompts: int) -> Intent:
        where = f"intents.{name}"
        raw = self.mapping(raw, where, INTENT_KEYS)
        keywords = tuple(tuple(normalize(k).split()) for k in self.texts(raw.get("keywords", []), f"{where}.keywords"))
        patterns = tuple(self.pattern(p, f"{where}.patterns[{i}]") for i, p in enumerate(
            self.texts(raw.get("patterns", []), f"{where}.patterns")))
        dtmf = str(raw["dtmf"]) if isinstance(raw.get("dtmf"), (str, int)) and not isinstance(raw.get("dtmf"), bool) else ""
        if "dtmf" in raw and not KEYS.fullmatch(dtmf):
            raise self.fail(f"{where}.dtmf", f"{raw['dtmf']!r} is not keypad keys (0-9, *, #, A-D); quote it")
        if not any(keywords) and not patterns and not dtmf:
            raise self.fail(where, "needs keywords, patterns or dtmf, or no caller can reach it")
        slots: dict[str, Slot] = {}
        raw_slots = raw.get("slots", [])
        if not isinstance(raw_slots, list):
            raise self.fail(f"{where}.slots", "expected a list of slots")
        for i, item in enumerate(raw_slots):
            slot = self.slot(item, f"{where}.slots[{i}]", set(slots), max_reprompts)
            slots[slot.name] = slot
        outcome = self.outcome({k: raw[k] for k in OUTCOME_KEYS if k in raw}, where, set(slots))
        raw_branches = raw.get("branches", [])
        if not isinstance(raw_branches, list):
            raise self.fail(f"{where}.branches", "expected a list of branches")
        branches = []
        for i, item in enumerate(raw_branches):
            item_where = f"{where}.branches[{i}]"
            item = self.mapping(item, item_where, BRANCH_KEYS)
            when = self.when(item["when"], f"{item_where}.when", slots)
            branches.append(Branch(when, self.outcome({k: v for k, v in item.items() if k != "when"},
                                                      item_where, set(slots))))
        return Intent(str(name), keywords, patterns, tuple(slots.values()), tuple(branches), outcome, dtmf)

    def flow(self, raw: Any) -> Flow:
        raw = self.mapping(raw, "", FLOW_KEYS)
        max_reprompts = self.count(raw.get("max_reprompts", DEFAULT_MAX_REPROMPTS), "max_reprompts", 0, 10)
        greeting = self.text(raw["greeting"], "greeting") if "greeting" in raw else ""
        fallback = Outcome(self.text(raw["fallback"], "fallback"))
        intents_raw = raw["intents"]
        if not isinstance(intents_raw, dict) or not intents_raw:
            raise self.fail("intents", "expected a mapping of intent names to intents")
        intents = tuple(self.intent(name, item, max_reprompts) for name, item in intents_raw.items())
        give_up = self.outcome(raw["give_up"], "give_up", set()) if "give_up" in raw else None
        if give_up is not None:  # the flow-wide default for slots that set none
            intents = tuple(_with_give_up(intent, give_up) for intent in intents)
        return Flow(self.path, greeting, fallback, intents)


def _with_give_up(intent: Intent, give_up: Outcome) -> Intent:
    slots = tuple(slot if slot.give_up else dataclasses.replace(slot, give_up=give_up) for slot in intent.slots)
    return dataclasses.replace(intent, slots=slots)


def load_flow(path: str | Path = DEFAULT_FLOW) -> Flow:
    """Read and validate a flow file; FlowError names the file and the problem."""
    checker = _Checker(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise checker.fail("", f"cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise checker.fail("", "is not UTF-8 text") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise checker.fail("", f"not valid YAML ({' '.join(str(exc).split())})") from None
    return checker.flow(raw)


@functools.lru_cache(maxsize=16)
def _cached(path: str, mtime_ns: int) -> Flow:
    return load_flow(path)


def cached_flow(path: str | Path = DEFAULT_FLOW) -> Flow:
    """load_flow, parsed once per file version: every call's responder shares the result."""
    try:
        mtime_ns = Path(path).stat().st_mtime_ns
    except OSError:
        return load_flow(path)  # raises the FlowError that names the problem
    return _cached(str(path), mtime_ns)
