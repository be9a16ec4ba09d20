"""The texts the streaming voice is distilled on (engine/train/prior_data.py) and judged on.

Two sources, mixed by MIX: the STT corpus (fortunes prose + contact-center turns,
engine/train/corpus.py) and assistant-style replies generated here (questions, lists,
amounts, dates, times, IDs, phone numbers; one to three sentences). Every text goes through
engine/text.py's normalizer first. Held out: a text whose normalized form hashes into
corpus.text_split's test part is never trained on; `heldout_written` draws such texts in
their written form (digits, symbols) for evaluation.
"""

from __future__ import annotations

import random

import numpy as np

from engine import text as frontend
from engine.textnorm import ordinal_words
from engine.train.corpus import build_corpus, text_split

SEED = 4242
MIX = {"corpus": 0.6, "assistant": 0.4}  # share of each text source

# -- assistant-style replies ------------------------------------------------------------------

NAMES = "Alex Jordan Taylor Morgan Sam Riley Casey Jamie Avery Quinn Maria David Priya Chen".split()
ITEMS = ("the blue backpack|a pair of running shoes|the wireless headset|two coffee mugs|the standing desk|"
         "a phone charger|the winter coat|three notebooks|the gift card|a replacement filter").split("|")
PLACES = "Seattle|Austin|Denver|Boston|Chicago|the Portland office|the downtown branch|your local store".split("|")
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = ("January February March April May June July August September October November December").split()
OPENERS = ("Sure.|Of course!|Absolutely.|Great question.|Got it.|Okay.|Thanks for waiting.|I understand.|"
           "Let me check that for you.|Good news!|I'm sorry about that.|No problem.|Happy to help.").split("|")
TEMPLATES = [
    "Your order {id} shipped on {month} {day} and should arrive by {weekday}.",
    "The total comes to ${dollars}.{cents}, including tax.",
    "I found {n} accounts under the name {name}. Which one would you like?",
    "Your appointment is on {weekday}, {month} {day}, at {hour}:{minute} {ampm}.",
    "Here are your options: first, a full refund; second, a replacement; or third, store credit.",
    "Would you like me to send the confirmation to the email on file?",
    "Your balance is ${dollars}, and the next payment of ${small} is due on {month} {day}.",
    "Can you confirm the last four digits of the card, please?",
    "The reference number is {code}. Do you want me to repeat that?",
    "I've updated your address to {number} {street} Street, {place}.",
    "It looks like {item} is back in stock at {place}.",
    "That plan costs ${small} a month, or ${dollars} a year, which saves you about {pct}%.",
    "Sorry, I didn't catch that. Could you say it again?",
    "Your flight leaves at {hour}:{minute} {ampm} from gate {gate}, and boarding starts {n} minutes earlier.",
    "I can offer {n} time slots: {weekday} at {hour} {ampm}, or {weekday2} at {hour2} {ampm}.",
    "The wait time is about {n} minutes right now.",
    "Your ticket number is {long}, and a specialist will call you back within {n} hours.",
    "To reset your password, open settings, tap security, and choose reset.",
    "Is there anything else I can help you with today?",
    "The store at {place} is open from {hour} {ampm} to {hour2} {ampm2}, {weekday} through {weekday2}.",
    "I see {n} items in your cart: {item}, {item2}, and {item3}.",
    "Your refund of ${dollars}.{cents} was issued on {month} {day} and takes {n} to {n2} business days.",
    "Please hold while I transfer you to {name} in billing.",
    "Call us at {phone} if the problem comes back.",
    "The package weighs {n}.{cents2} pounds and ships from {place}.",
    "I have you down for {n} guests on the {ordinal} of {month}.",
    "Thanks, {name}. I've noted that you prefer to be contacted by text.",
    "Would {weekday} morning or {weekday2} afternoon work better for you?",
    "Your order {id} was delivered today at {hour}:{minute} {ampm}.",
    "Your current data usage is {n}.{cents2} gigabytes out of {n2} gigabytes.",
]


def _fill(template: str, rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    values = {
        "id": rng.choice([str(rng.randrange(10**5, 10**8)), "".join(rng.choices(letters, k=2)) + str(rng.randrange(1000, 99999))]),
        "month": rng.choice(MONTHS), "day": rng.randrange(1, 29), "weekday": rng.choice(DAYS),
        "weekday2": rng.choice(DAYS), "dollars": f"{rng.choice([rng.randrange(1, 100), rng.randrange(100, 2500), rng.randrange(1000, 20000)]):,}",
        "cents": f"{rng.randrange(100):02d}", "cents2": rng.randrange(1, 10), "small": rng.randrange(5, 80),
        "n": rng.randrange(2, 12), "n2": rng.randrange(12, 40), "name": rng.choice(NAMES),
        "hour": rng.randrange(1, 13), "hour2": rng.randrange(1, 13), "minute": f"{rng.choice([0, 15, 30, 45, rng.randrange(60)]):02d}",
        "ampm": rng.choice(["am", "pm", "a.m.", "p.m."]), "ampm2": rng.choice(["am", "pm"]),
        "code": "".join(rng.choices(letters, k=3)) + "-" + str(rng.randrange(100, 9999)),
        "number": rng.randrange(1, 9999), "street": rng.choice(["Maple", "Oak", "Cedar", "Main", "Park"]),
        "place": rng.choice(PLACES), "item": rng.choice(ITEMS), "item2": rng.choice(ITEMS), "item3": rng.choice(ITEMS),
        "pct": rng.randrange(5, 40), "gate": rng.choice(letters) + str(rng.randrange(1, 40)),
        "long": str(rng.randrange(10**9, 10**10)), "ordinal": f"{rng.randrange(1, 29)}{''}",
        "phone": f"{rng.randrange(200, 999)}-{rng.randrange(200, 999)}-{rng.randrange(1000, 9999)}",
    }
    values["ordinal"] = ordinal_words(int(values["ordinal"]))
    return template.format(**values)


def assistant_reply(rng: random.Random) -> str:
    """One to three sentences an assistant might say, with an opener half the time."""
    parts = [rng.choice(OPENERS)] if rng.random() < 0.5 else []
    parts += [_fill(rng.choice(TEMPLATES), rng) for _ in range(rng.choice([1, 1, 1, 2, 2, 3]))]
    return " ".join(parts)


_CORPUS: list[str] = []


def _corpus_texts() -> list[str]:
    if not _CORPUS:
        _CORPUS.extend(" ".join(u.segments) for u in build_corpus())
    return _CORPUS


def heldout_written(n: int, seed: int = SEED + 7) -> list[str]:
    """n written-form texts (digits, symbols) whose spoken form is in the held-out split."""
    rng, out = random.Random(seed), []
    corpus = _corpus_texts()
    while len(out) < n:
        raw = assistant_reply(rng) if len(out) % 2 == 0 else rng.choice(corpus)
        spoken = frontend.normalize_text(raw)
        if text_split(spoken.lower()) == "test" and raw not in out and 4 <= len(spoken.split()) <= 40:
            out.append(raw)
    return out


def trained_texts(n: int, seed: int = SEED) -> list[str]:
    """The first training text of shards 0..n-1 (spoken form): lines the student has learned,
    to tell a generalisation error from an underfit one (bench/tts_stream_swap.py)."""
    return [next(spoken for spoken, split in texts(seed + 1000 * k) if split == "train") for k in range(n)]


def texts(seed: int = SEED):
    """Endless (text, split) pairs: corpus turns and assistant replies, mixed by MIX."""
    rng = random.Random(seed)
    corpus = list(_corpus_texts())
    rng.shuffle(corpus)
    position = 0
    while True:
        if rng.random() < MIX["corpus"]:
            raw = corpus[position % len(corpus)]
            position += 1
        else:
            raw = assistant_reply(rng)
        spoken = frontend.normalize_text(raw)
        if frontend.spoken_words(spoken):
            yield spoken, text_split(spoken.lower())


def _sentences(ids: np.ndarray) -> list[np.ndarray]:
    """Split an id sequence after each EOS (Piper synthesizes one sentence at a time)."""
    ends = np.nonzero(ids == frontend.EOS_ID)[0]
    cuts = [0] + [int(e) + 1 for e in ends]
    if cuts[-1] != len(ids):
        cuts.append(len(ids))
    return [ids[a:b] for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
