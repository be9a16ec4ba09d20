"""Offline text corpus for STT training: general English plus contact-center dialogue.

Over 400 lines, kept as one module: most of it is word lists and small sentence templates
(t_*), a few lines each, which are easier to review side by side than spread out.

An utterance is a list of *segments* (what a TTS engine is asked to say, with its
punctuation) and one normalized target `text`. The synthesizer joins segments with
300-900 ms of silence: these are the mid-turn pauses the end-of-turn head must not
mistake for the end of the turn (a filler, "so...", a digit string read in groups).

Everything is deterministic from a seed. The train/test split is a hash of the
normalized text, so a sentence can never be on both sides, whatever the seed.

    python -m engine.train.corpus --stats            # sizes and a few samples
"""

import argparse
import hashlib
import os
import random
import re
import zlib
from dataclasses import dataclass

from engine.textnorm import normalize, number_to_words, ordinal_words, year_words

SEED = 1234
N_DIALOGUE = 60_000        # generated contact-center utterances (distinct texts)
N_SHORT = 3_000            # short complete turns (a name, an intent, a number), a corpus of their own
TEST_PERCENT = 3           # % of distinct texts held out for evaluation (by hash)
FORTUNES_DIR = "/usr/share/games/fortunes"  # Debian package `fortunes` (+ fortunes-min)
FORTUNE_FILES = ("fortunes", "literature", "humorists", "food", "kids", "education",
                 "love", "miscellaneous", "people", "pets", "platitudes", "science",
                 "sports", "wisdom", "work", "goedel", "law", "medicine", "riddles",
                 "songs-poems", "magic", "paradoxum", "cookie", "startrek")
MIN_WORDS, MAX_WORDS = 3, 28   # sentence length kept from general text
P_SPLIT_AT_COMMA = 0.35        # chance a general-text comma becomes a mid-turn pause


@dataclass(frozen=True)
class Utterance:
    segments: tuple[str, ...]   # TTS input, one per stretch of speech
    text: str                   # normalized target transcript
    kind: str                   # "general" | a dialogue template family

    @property
    def split(self) -> str:
        return text_split(self.text)


def text_split(text: str) -> str:
    """'test' for TEST_PERCENT % of normalized texts (stable hash), else 'train'."""
    h = int(hashlib.md5(text.encode()).hexdigest()[:8], 16)
    return "test" if h % 100 < TEST_PERCENT else "train"


def make(segments, kind: str) -> Utterance:
    segs = tuple(s.strip() for s in segments if s.strip())
    return Utterance(segs, normalize(" ".join(segs)), kind)


# ---------------------------------------------------------------- general English

def _clean_sentence(s: str) -> str | None:
    """Keep plain prose a TTS engine reads exactly as written (no digits, no symbols)."""
    s = s.replace("``", '"').replace("''", '"').replace('"', "").strip(" -")
    s = re.sub(r"\s+", " ", s)
    if not re.fullmatch(r"[A-Za-z][A-Za-z ,.'?!;:-]*[.?!]", s):
        return None
    if re.search(r"\b[A-Z]{2,}\b|--|'\s|\s'|\.\.", s):   # acronyms, dashes, stray quotes
        return None
    n = len(s.split())
    return s if MIN_WORDS <= n <= MAX_WORDS else None


def general_sentences(fortunes_dir: str = FORTUNES_DIR) -> list[str]:
    """Sentences from the Debian fortune files present on this machine (may be none)."""
    out = {}
    for name in FORTUNE_FILES:
        path = os.path.join(fortunes_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="ignore") as f:
            for cookie in f.read().split("\n%\n"):
                lines = [ln for ln in cookie.splitlines() if not ln.lstrip().startswith("--")]
                prose = " ".join(ln.strip() for ln in lines)
                for s in re.split(r"(?<=[.?!])\s+(?=[A-Z])", prose):
                    s = _clean_sentence(s)
                    if s:
                        out[s] = None
    return list(out)


def general_utterance(sentence: str, rng: random.Random) -> Utterance:
    """Cut a sentence at some commas into segments: natural mid-turn pauses."""
    parts = re.split(r"(?<=[,;:])\s+", sentence)
    segs, cur = [], ""
    for p in parts:
        cur = f"{cur} {p}".strip()
        if p.endswith((",", ";", ":")) and rng.random() < P_SPLIT_AT_COMMA:
            segs.append(cur)
            cur = ""
    if cur:
        segs.append(cur)
    return make(segs, "general")


# ---------------------------------------------------------------- dialogue material

FIRST = ("James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William "
         "Barbara Richard Susan Joseph Jessica Thomas Sarah Charles Karen Daniel Nancy "
         "Matthew Lisa Anthony Betty Mark Sandra Steven Ashley Paul Emily Andrew Donna "
         "Joshua Michelle Kevin Carol Brian Amanda George Melissa Edward Deborah Ronald "
         "Laura Maria Carlos Priya Wei Ahmed Fatima Olga Kenji Aisha Diego").split()
LAST = ("Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez "
        "Hernandez Lopez Wilson Anderson Thomas Taylor Moore Jackson Martin Lee Thompson "
        "White Harris Clark Lewis Robinson Walker Young Allen King Wright Scott Green "
        "Baker Adams Nelson Hill Campbell Mitchell Roberts Carter Phillips Evans Turner "
        "Parker Collins Edwards Stewart Morris Murphy Cook Rogers Nguyen Patel Kim").split()
STREETS = ("Maple Oak Pine Cedar Elm Washington Lake Hill Park Main Sunset Highland "
           "River Church Spring Meadow Forest Lincoln Jackson Madison Franklin Chestnut "
           "Willow Walnut Cherry Ridge Valley Mill").split()
STREET_TYPES = "Street Avenue Road Drive Lane Boulevard Court Way Place Terrace".split()
CITIES = ("Springfield, Portland, Austin, Denver, Boston, Seattle, Phoenix, Atlanta, "
          "Chicago, Dallas, Miami, Columbus, Nashville, Detroit, Sacramento, Raleigh, "
          "Tucson, Omaha, Albany, Richmond, Madison, Fresno, Newark, Orlando").split(", ")
PRODUCTS = ("laptop, phone case, coffee maker, pair of shoes, winter jacket, blender, "
            "printer, charger, desk lamp, backpack, water bottle, headset, router, "
            "vacuum cleaner, mattress, office chair, gift card, subscription, "
            "microwave, set of towels, camera, monitor, keyboard, tablet").split(", ")
DOMAINS = "gmail dot com|yahoo dot com|outlook dot com|example dot org|hotmail dot com".split("|")
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS_CAP = ("January February March April May June July August September October "
              "November December").split()
FILLERS = ("Um,", "Uh,", "So...", "Let me see,", "Hold on,", "Okay so,", "Hmm,", "Well,",
           "Give me a second,", "Right,", "Let me check,")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DIGIT_WORDS = "zero one two three four five six seven eight nine".split()
COMPANIES = ("Acme", "Northwind", "Bluebird", "Summit", "Riverside", "Evergreen", "Pioneer",
             "Harbor", "Lakeside", "Horizon")


def digit_word(d: int, rng: random.Random) -> str:
    """Callers say zero as 'oh' about half the time."""
    return ("oh" if rng.random() < 0.5 else "zero") if d == 0 else DIGIT_WORDS[d]


def digit_groups(rng: random.Random, n: int, group: int = 3) -> list[str]:
    """A digit string read in groups: ['four one two,', 'seven seven nine,', 'oh three']."""
    digits = [rng.randrange(10) for _ in range(n)]
    words = [digit_word(d, rng) for d in digits]
    groups = [" ".join(words[i:i + group]) for i in range(0, n, group)]
    return [g + "," for g in groups[:-1]] + [groups[-1]]


def spelled(word: str) -> str:
    """'SMITH' -> 'S, M, I, T, H' or 'S. M. I. T. H' (the separator keeps TTS engines
    saying letter names instead of reading a word; the period spaces them further)."""
    sep = ". " if zlib.crc32(word.encode()) % 2 else ", "
    return sep.join(word.upper())


def money_spoken(rng: random.Random) -> str:
    dollars = rng.choice([rng.randrange(1, 20), rng.randrange(20, 200), rng.randrange(200, 5000)])
    cents = rng.choice([0, 0, 99, 50, 25, rng.randrange(1, 100)])
    style = rng.random()
    d = number_to_words(dollars)
    if cents == 0:
        return f"{d} dollars" if dollars != 1 else "one dollar"
    c = number_to_words(cents)
    if style < 0.5:
        return f"{d} dollars and {c} cents"
    return f"{d} {c}" if cents >= 10 else f"{d} oh {c}"


def date_spoken(rng: random.Random) -> str:
    m, day = rng.choice(MONTHS_CAP), rng.randrange(1, 29)
    r = rng.random()
    if r < 0.4:
        return f"{m} {ordinal_words(day)}"
    if r < 0.7:
        return f"the {ordinal_words(day)} of {m}"
    if r < 0.85:
        return f"{rng.choice(WEEKDAYS)}, {m} {ordinal_words(day)}"
    return f"{m} {ordinal_words(day)}, {year_words(rng.randrange(1950, 2031))}"


def time_spoken(rng: random.Random) -> str:
    h, m = rng.randrange(1, 13), rng.choice([0, 0, 15, 30, 45, rng.randrange(1, 60)])
    ampm = rng.choice(["a.m.", "p.m.", "in the morning", "in the afternoon", ""])
    if m == 0:
        t = f"{number_to_words(h)} o'clock" if not ampm or rng.random() < 0.3 else number_to_words(h)
    elif m == 30 and rng.random() < 0.3:
        t = f"half past {number_to_words(h)}"
    elif m < 10:
        t = f"{number_to_words(h)} oh {number_to_words(m)}"
    else:
        t = f"{number_to_words(h)} {number_to_words(m)}"
    return f"{t} {ampm}".strip()


def address_spoken(rng: random.Random) -> str:
    num = rng.randrange(1, 9999)
    if num >= 100 and rng.random() < 0.6:   # "twelve forty", "four oh five"
        hi, lo = divmod(num, 100)
        n = f"{number_to_words(hi)} {number_to_words(lo) if lo >= 10 else 'oh ' + number_to_words(lo)}" if lo else f"{number_to_words(hi)} hundred"
    else:
        n = number_to_words(num)
    street = f"{n} {rng.choice(STREETS)} {rng.choice(STREET_TYPES)}"
    if rng.random() < 0.3:
        street += f", apartment {number_to_words(rng.randrange(1, 40))} {rng.choice('ABCD')}"
    return street


def _filler(rng: random.Random, p: float = 0.25) -> list[str]:
    return [rng.choice(FILLERS)] if rng.random() < p else []


def dialogue_utterance(rng: random.Random) -> Utterance:
    """One caller or agent turn from a weighted family of contact-center templates."""
    family = rng.choices(list(TEMPLATES), weights=[w for w, _ in TEMPLATES.values()])[0]
    return make(TEMPLATES[family][1](rng), family)


def t_order(rng):
    lead = rng.choice(["My order number is", "The order number is", "It's order", "Order number",
                       "I have the order number here, it's", "The confirmation number is"])
    return _filler(rng) + [lead] + digit_groups(rng, rng.choice([6, 7, 8, 9, 10]), rng.choice([2, 3, 3, 4])) \
        + ([rng.choice(["Did you get that?", "That's it.", "Okay?"])] if rng.random() < 0.2 else [])


def t_account(rng):
    lead = rng.choice(["My account number is", "The account number is", "It's account",
                       "The last four digits are", "My member ID is", "The card ends in"])
    n = 4 if "four" in lead or "ends" in lead else rng.choice([6, 8, 10, 12])
    return _filler(rng) + [lead] + digit_groups(rng, n, rng.choice([2, 3, 4]))


def t_phone(rng):
    lead = rng.choice(["My phone number is", "You can reach me at", "The best number is",
                       "Call me back at", "My cell is"])
    d = digit_groups(rng, 10, 3)   # 3-3-4 grouping, the way US numbers are read
    d = [d[0], d[1], d[2].rstrip(",") + " " + d[3]]
    return [lead] + d


def t_money(rng):
    s = rng.choice(["I was charged {m} twice.", "The total came to {m}.", "Your balance is {m}.",
                    "I'd like a refund of {m}.", "Can I pay {m} today?", "That will be {m}.",
                    "The bill says {m} but it should be {m2}.", "I paid {m} last month.",
                    "Your refund of {m} will arrive in {n} business days.",
                    "The monthly fee went up to {m}."])
    return _filler(rng) + [s.format(m=money_spoken(rng), m2=money_spoken(rng),
                                     n=number_to_words(rng.randrange(2, 11)))]


def t_date_time(rng):
    s = rng.choice(["Can I book an appointment for {d}?", "It was delivered on {d}.",
                    "The payment is due on {d}.", "How about {d} at {t}?",
                    "We're open until {t}.", "I called on {d} and nobody answered.",
                    "My appointment is at {t}.", "Could somebody come by at {t}?",
                    "The technician will arrive between {t} and {t2}.",
                    "I ordered it on {d} and it still hasn't arrived.", "My date of birth is {d}."])
    return _filler(rng) + [s.format(d=date_spoken(rng), t=time_spoken(rng), t2=time_spoken(rng))]


def t_address(rng):
    lead = rng.choice(["My address is", "Please ship it to", "I live at", "The billing address is",
                       "It should go to", "I moved to"])
    city = rng.choice(CITIES)
    zip_ = digit_groups(rng, 5, 5)
    tail = [f"in {city}."] if rng.random() < 0.5 else [f"{city},", "zip code " + zip_[0] + "."]
    return _filler(rng) + [lead + " " + address_spoken(rng) + ","] + tail


def t_spell_name(rng):
    first, last = rng.choice(FIRST), rng.choice(LAST)
    r = rng.random()
    if r < 0.4:
        return [f"My name is {first} {last}.", "That's", spelled(last) + "."]
    if r < 0.7:
        return [f"It's {last},", spelled(last[:3]) + ",", spelled(last[3:]) + "."] if len(last) > 4 \
            else [f"It's {last},", spelled(last) + "."]
    return [rng.choice(["Last name", "The last name is", "Surname"]) + " " + spelled(last) + "."]


def t_email(rng):
    first, last = rng.choice(FIRST).lower(), rng.choice(LAST).lower()
    user = rng.choice([f"{first} dot {last}", f"{first}{last[0]}", f"{first[0]}{last}",
                       f"{first} underscore {last}", f"{first} {number_to_words(rng.randrange(1, 100))}"])
    return _filler(rng) + [f"My email is {user}", f"at {rng.choice(DOMAINS)}."]


def t_code(rng):
    letters = "".join(rng.choice(LETTERS) for _ in range(rng.choice([2, 3])))
    digits = digit_groups(rng, rng.choice([3, 4, 6]), 3)
    lead = rng.choice(["The reference code is", "My confirmation code is", "The ticket number is",
                       "The tracking code is", "The promo code is"])
    return [lead, spelled(letters) + ","] + digits


def t_yes_no(rng):
    return [rng.choice([
        "Yes.", "Yeah.", "Yes, that's right.", "Yep, that's correct.", "No.", "Nope.",
        "No, that's not it.", "Correct.", "That's correct.", "Sure.", "Okay.", "Absolutely.",
        "Yes please.", "No thank you.", "Uh huh.", "Not really.", "I think so.", "I don't think so.",
        "That's all, thanks.", "Yes, go ahead.", "Okay, sounds good.", "Perfect, thank you.",
        "Sorry, could you repeat that?", "Can you say that again?", "I'm not sure.",
        "Yes, that works for me.", "No, that's everything."])]


def t_correction(rng):
    a = digit_groups(rng, 3, 3)[0]
    b = digit_groups(rng, 3, 3)[0]
    return rng.choice([
        ["No wait,", f"it's {a},", f"not {b}."],
        ["Sorry,", f"I meant {rng.choice(WEEKDAYS)},", f"not {rng.choice(WEEKDAYS)}."],
        ["Actually,", f"make that {money_spoken(rng)}."],
        ["No no,", f"the last name is {rng.choice(LAST)},", spelled(rng.choice(LAST)) + "."],
        ["Let me correct that,", f"it's {address_spoken(rng)}."],
        [f"That's {a}...", f"sorry, {b}."],
        ["Not the", f"{ordinal_words(rng.randrange(1, 29))},", f"the {ordinal_words(rng.randrange(1, 29))}."],
    ])


def t_request(rng):
    p = rng.choice(PRODUCTS)
    s = rng.choice([
        f"I'd like to return a {p}.", f"My {p} arrived damaged.", f"I never received my {p}.",
        f"I want to cancel my {p} order.", f"Can you tell me when my {p} will ship?",
        "I need to reset my password.", "I'd like to speak to a manager.",
        "I want to update my payment method.", "My internet has been down since this morning.",
        "I was double charged on my last statement.", "I'm calling about my bill.",
        "I need to change my delivery address.", "How do I upgrade my plan?",
        f"I bought a {p} and it stopped working after {number_to_words(rng.randrange(2, 30))} days.",
        "Can you check the status of my claim?", "I'd like to close my account.",
        f"Is the {p} still under warranty?", "I can't log in to the app.",
        "The package says delivered but it's not here.", "Do you have any openings this week?"])
    return _filler(rng, 0.35) + [s]


def t_agent(rng):
    s = rng.choice([
        f"Thank you for calling {rng.choice(COMPANIES)}, my name is {rng.choice(FIRST)}, how can I help you today?",
        "Can I have your account number, please?", "Could you spell your last name for me?",
        "Let me pull up your account.", "I'm sorry to hear that.", "Is there anything else I can help you with?",
        "One moment while I check that for you.", "Could you verify the address on file?",
        f"I see a charge of {money_spoken(rng)} on {date_spoken(rng)}.",
        f"Your order will arrive by {date_spoken(rng)}.", "I've processed that refund for you.",
        "Can you confirm your date of birth?", "I'll transfer you to the billing department.",
        f"Your appointment is confirmed for {date_spoken(rng)} at {time_spoken(rng)}.",
        "Thanks for your patience.", "Have a great day."])
    return [s]


def t_multi(rng):
    """Two short sentences in one turn, with a pause between them."""
    a = dialogue_utterance(rng).segments
    b = t_yes_no(rng) if rng.random() < 0.5 else t_request(rng)
    return list(b) + list(a)


TEMPLATES = {  # family: (weight, generator)
    "order": (10, t_order), "account": (8, t_account), "phone": (6, t_phone),
    "money": (8, t_money), "date_time": (10, t_date_time), "address": (8, t_address),
    "spell_name": (7, t_spell_name), "email": (4, t_email), "code": (5, t_code),
    "yes_no": (3, t_yes_no), "correction": (6, t_correction), "request": (8, t_request),
    "agent": (6, t_agent), "multi": (6, t_multi),
}


SHORT_NAMES = "Sue Tom Ann Bob Max Eve Jo Kim Ray Lou Dan Meg Ben Amy Sam Liz Ted Jen Pat Ron".split()
INTENTS = (
    "Order status.", "I'm calling about my order.", "Where is my order?", "My order.", "Tracking.",
    "Opening hours.", "When are you open?", "What are your hours?", "Are you open today?",
    "Billing.", "I have a billing question.", "A question about my bill.", "A charge I don't recognize.",
    "Talk to a person.", "Can I talk to a person?", "Representative.", "Agent, please.", "Operator.",
    "I want to speak to someone.", "A human, please.", "Call me back.", "Please call me back.",
    "Cancel.", "Help.", "Hello?", "Hi.", "Hi there.", "Hello, anyone there?", "Goodbye.", "Thanks, bye.",
    "That's it.", "Nothing else.", "Refund.", "I need a refund.", "Returns.", "Technical support.",
    "Repeat that.", "Main menu.", "Start over.", "Other.", "Something else.")


def short_turn(rng: random.Random) -> Utterance:
    """A complete short answer of the kind a caller gives a voice agent: a name, an intent, a
    number, a day, yes or no. Said alone and then silence, the turn is over."""
    first, last = rng.choice(FIRST + SHORT_NAMES * 2), rng.choice(LAST)
    r = rng.random()
    if r < 0.3:
        s = rng.choice([f"My name is {first}.", f"It's {first}.", f"This is {first}.", f"{first}.",
                        f"{first} {last}.", f"My name is {first} {last}.", f"The name is {last}.",
                        f"I'm {first}.", f"{first} here.", f"It's {first} {last}."])
    elif r < 0.55:
        s = rng.choice(INTENTS)
    elif r < 0.7:
        s = " ".join(digit_groups(rng, rng.choice([1, 2, 3, 4, 6]), 3)) + "."
    elif r < 0.8:
        s = rng.choice([f"{rng.choice(WEEKDAYS)}.", f"Next {rng.choice(WEEKDAYS)}.", "Tomorrow.", "Today.",
                        f"{date_spoken(rng)}.", f"At {time_spoken(rng)}.", f"{time_spoken(rng)}."])
    else:
        s = t_yes_no(rng)[0]
    return make([s], "short")


def short_turn_corpus(seed: int = SEED, n: int = N_SHORT) -> list[Utterance]:
    """Distinct short complete turns (see short_turn), deterministic for a seed."""
    rng = random.Random(seed + 1)
    out: dict[str, Utterance] = {}
    for _ in range(20 * n):
        u = short_turn(rng)
        if u.text:
            out.setdefault(u.text, u)
        if len(out) >= n:
            break
    return list(out.values())


# ---------------------------------------------------------------- the corpus

def _general_utterances(rng: random.Random, fortunes_dir: str) -> dict[str, Utterance]:
    out: dict[str, Utterance] = {}
    for s in general_sentences(fortunes_dir):
        u = general_utterance(s, rng)
        if u.text:
            out.setdefault(u.text, u)
    return out


def general_corpus(seed: int = SEED, fortunes_dir: str = FORTUNES_DIR) -> list[Utterance]:
    """The general-English part of build_corpus alone (the same utterances, so the same test
    split): prose is where the model is weakest, and this lets a folder of shards hold only it."""
    return list(_general_utterances(random.Random(seed), fortunes_dir).values())


def build_corpus(seed: int = SEED, n_dialogue: int = N_DIALOGUE,
                 fortunes_dir: str = FORTUNES_DIR) -> list[Utterance]:
    """All distinct utterances (general + dialogue), deterministic for a seed."""
    rng = random.Random(seed)
    out = _general_utterances(rng, fortunes_dir)
    n_general = len(out)
    attempts = 0
    while len(out) < n_general + n_dialogue and attempts < 20 * n_dialogue:
        attempts += 1
        u = dialogue_utterance(rng)
        if u.text:
            out.setdefault(u.text, u)
    return list(out.values())


def split_corpus(corpus: list[Utterance]) -> tuple[list[Utterance], list[Utterance]]:
    """(train, test) by the stable text hash."""
    train = [u for u in corpus if u.split == "train"]
    test = [u for u in corpus if u.split == "test"]
    return train, test


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--stats", action="store_true")
    p.add_argument("--dump", help="write train sentences (one per line) to this file")
    a = p.parse_args()
    corpus = build_corpus(a.seed)
    train, test = split_corpus(corpus)
    kinds: dict[str, int] = {}
    for u in corpus:
        kinds[u.kind] = kinds.get(u.kind, 0) + 1
    print(f"{len(corpus)} utterances: {len(train)} train, {len(test)} test; "
          f"{sum(len(u.segments) > 1 for u in corpus)} with mid-turn pauses")
    print("by kind:", dict(sorted(kinds.items())))
    if a.stats:
        rng = random.Random(0)
        for u in rng.sample(corpus, 12):
            print(f"  {u.kind:10s} {' | '.join(u.segments)}\n             -> {u.text}")
    if a.dump:
        with open(a.dump, "w") as f:
            f.writelines(u.text + "\n" for u in train)


if __name__ == "__main__":
    main()
