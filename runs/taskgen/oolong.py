"""OOLONG-style aggregation tasks, generated from a seed at any size.

The context is one record per line, as in OOLONG's trec_coarse split:
``Date: Mar 14, 2023 || User: 48213 || Instance: Where is the old lighthouse located?``.
Each question belongs to one of six coarse categories that the text never states: the model
has to read each question to know it (as in OOLONG, a sub-model labels the records). Users
follow an 80/20 skew: a fifth of them ask four fifths of the questions.

Two families:
- ``oolong``: the most or least frequent label, the count of a label, a user's count of a
  label, or a label's count over a range of months. A label answer scores 1 or 0; a number
  scores 0.75 ** |error|, as OOLONG scores numeric answers.
- ``pairs`` (OOLONG-Pairs style): every pair of users who each asked at least T questions of
  a label, scored by F1 over the pairs.

The records are never held: a stats pass over the seeded stream computes the answer, and
``write_context`` replays the same stream to disk.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

CHARS_PER_TOKEN = 4
LABELS = (
    "abbreviation",
    "entity",
    "description and abstract concept",
    "human being",
    "location",
    "numeric value",
)
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
FIRST_YEAR, YEARS = 2021, 3
HEAVY_SHARE = 0.8  # of the records, asked by HEAVY_USERS of the users
HEAVY_USERS = 0.2
_AVERAGE_RECORD_CHARS = 92  # measured over the templates; sizes the record count

_ABBR = ("NASA", "UNESCO", "NATO", "FIFA", "OPEC", "CERN", "UNICEF", "IMF", "WHO", "BBC")
_ORGS = ("red cross", "royal society", "city orchestra", "rowing club", "chess federation")
_PEOPLE = (
    "Ada Lovelace", "Marie Curie", "Nikola Tesla", "Frida Kahlo", "Alan Turing",
    "Jane Austen", "Leonardo da Vinci", "Rosalind Franklin", "Isaac Newton", "Hypatia",
)  # fmt: skip
_PLACES = ("Lisbon", "Kyoto", "Nairobi", "Quito", "Oslo", "Hanoi", "Cairo", "Lima", "Perth")
_LANDMARKS = ("old lighthouse", "stone bridge", "glass museum", "northern observatory",
              "harbour fort", "great library", "clock tower")  # fmt: skip
_THINGS = ("violin", "steam engine", "compass", "telescope", "windmill", "sundial", "kite",
           "barometer", "lantern", "printing press")  # fmt: skip
_ANIMALS = ("dog", "horse", "parrot", "cat", "goat")
_PET_NAMES = ("Biscuit", "Comet", "Juniper", "Pepper", "Rusty", "Willow")
_EVENTS = ("summer games", "world fair", "film festival", "chess olympiad", "jazz festival")
_WORDS = ("serendipity", "melancholy", "ephemeral", "nostalgia", "wanderlust", "solace")
_ADJECTIVES = ("so heavy", "painted red", "kept indoors", "so loud", "made of brass")

# Templates per label. Each is worded the way its category is recognised (who -> human,
# where -> location, how many -> numeric...), and the label itself never appears.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "abbreviation": (
        "What does {abbr} stand for?",
        "What is the abbreviation for the {org}?",
    ),
    "entity": (
        "What kind of {animal} is {pet}?",
        "Which instrument did {person} play?",
        "What is the name of the {thing} in {place}?",
    ),
    "description and abstract concept": (
        "Why is the {thing} {adj}?",
        "How does a {thing} work?",
        "What is the meaning of the word {word}?",
    ),
    "human being": (
        "Who invented the {thing}?",
        "Who founded the {org}?",
        "Who painted the portrait of {person}?",
    ),
    "location": (
        "Where is the {landmark} located?",
        "Which city hosted the {event} in {year}?",
        "Which country is {place} in?",
    ),
    "numeric value": (
        "How many {thing}s are there in {place}?",
        "When was the {landmark} built?",
        "How much does a {thing} weigh?",
    ),
}
_FIELDS = {
    "abbr": _ABBR,
    "org": _ORGS,
    "person": _PEOPLE,
    "place": _PLACES,
    "landmark": _LANDMARKS,
    "thing": _THINGS,
    "animal": _ANIMALS,
    "pet": _PET_NAMES,
    "event": _EVENTS,
    "word": _WORDS,
    "adj": _ADJECTIVES,
    "year": tuple(str(y) for y in range(1950, 2020, 7)),
}
_FIELD = re.compile(r"\{(\w+)\}")

INTRO = (
    "The context lists general-knowledge questions, one per line. Each line consists of a "
    "date, a user ID and a question. Each question can be labelled as one of these labels "
    "(the data does not give the labels; tell them from what each question asks): "
    + ", ".join(LABELS)
    + ". "
)


@dataclass(frozen=True)
class Stats:
    records: int
    by_label: dict[str, int]
    by_user_label: dict[tuple[int, str], int]
    by_month_label: dict[tuple[int, int, str], int]  # (year, month, label)
    users: tuple[int, ...]


@dataclass(frozen=True)
class OolongTask:
    name: str
    question: str
    expected_answer: str
    context_chars: int
    seed_text: str
    records: int
    users: tuple[int, ...]
    heavy: int

    def lines(self) -> Iterator[str]:
        return _records(self.seed_text, self.records, self.users, self.heavy)

    def context_text(self) -> str:
        return "".join(self.lines())

    def write_context(self, path: Path) -> None:
        with Path(path).open("w", encoding="utf-8", newline="") as out:
            batch: list[str] = []
            for line in self.lines():
                batch.append(line)
                if len(batch) >= 20_000:
                    out.write("".join(batch))
                    batch.clear()
            out.write("".join(batch))


def make_oolong(tokens: int, seed: int) -> OolongTask:
    return _make("oolong", tokens, seed)


def make_pairs(tokens: int, seed: int) -> OolongTask:
    return _make("pairs", tokens, seed)


def _make(name: str, tokens: int, seed: int) -> OolongTask:
    if tokens < 1:
        raise ValueError(f"tokens must be positive, not {tokens}")
    seed_text = f"frlm-oolong:{tokens}:{seed}"
    records = max(12, tokens * CHARS_PER_TOKEN // _AVERAGE_RECORD_CHARS)
    setup = random.Random(seed_text + ":setup")
    user_count = min(2000, max(8, records // 30))
    users = tuple(setup.sample(range(10_000, 99_999), user_count))
    heavy = max(1, round(user_count * HEAVY_USERS))
    stats, chars = _stats(seed_text, records, users, heavy)
    ask = random.Random(seed_text + ":question")
    if name == "pairs":
        question, expected = _pairs_question(ask, stats)
    else:
        question, expected = _oolong_question(ask, stats)
    return OolongTask(
        name=name,
        question=INTRO + question,
        expected_answer=expected,
        context_chars=chars,
        seed_text=seed_text,
        records=records,
        users=users,
        heavy=heavy,
    )


def _records(seed_text: str, records: int, users: tuple[int, ...], heavy: int) -> Iterator[str]:
    """The record lines, from the seed: the same every time."""
    for year, month, day, user, _label, text in _stream(seed_text, records, users, heavy):
        yield _line(year, month, day, user, text)


def _line(year: int, month: int, day: int, user: int, text: str) -> str:
    return f"Date: {MONTHS[month - 1]} {day:02d}, {year} || User: {user} || Instance: {text}\n"


def _stream(
    seed_text: str, records: int, users: tuple[int, ...], heavy: int
) -> Iterator[tuple[int, int, int, int, str, str]]:
    rng = random.Random(seed_text + ":records")
    weights_rng = random.Random(seed_text + ":labels")
    # Unequal label shares, so that a most and a least frequent label exist.
    weights = [weights_rng.uniform(0.4, 2.5) for _ in LABELS]
    cumulative = []
    total = 0.0
    for weight in weights:
        total += weight
        cumulative.append(total)
    light = len(users) - heavy
    for _ in range(records):
        label = rng.choices(LABELS, cum_weights=cumulative)[0]
        if light == 0 or rng.random() < HEAVY_SHARE:
            user = users[rng.randrange(heavy)]
        else:
            user = users[heavy + rng.randrange(light)]
        year = FIRST_YEAR + rng.randrange(YEARS)
        month = 1 + rng.randrange(12)
        day = 1 + rng.randrange(28)
        template = rng.choice(TEMPLATES[label])
        text = _FIELD.sub(lambda m: rng.choice(_FIELDS[m.group(1)]), template)
        yield year, month, day, user, label, text


def _stats(seed_text: str, records: int, users: tuple[int, ...], heavy: int) -> tuple[Stats, int]:
    by_label = dict.fromkeys(LABELS, 0)
    by_user_label: dict[tuple[int, str], int] = {}
    by_month_label: dict[tuple[int, int, str], int] = {}
    chars = 0
    for year, month, day, user, label, text in _stream(seed_text, records, users, heavy):
        chars += len(_line(year, month, day, user, text))
        by_label[label] += 1
        by_user_label[(user, label)] = by_user_label.get((user, label), 0) + 1
        key = (year, month, label)
        by_month_label[key] = by_month_label.get(key, 0) + 1
    return Stats(records, by_label, by_user_label, by_month_label, users), chars


def _oolong_question(rng: random.Random, stats: Stats) -> tuple[str, str]:
    counts = stats.by_label
    ranked = sorted(counts.values())
    kinds = ["count", "user", "timeline"]
    if ranked[-1] != ranked[-2]:
        kinds.append("most")
    if ranked[0] != ranked[1]:
        kinds.append("least")
    kind = rng.choice(sorted(kinds))
    label = rng.choice(LABELS)
    if kind == "most":
        answer = max(counts, key=counts.__getitem__)
        return "Which label is the most common among the questions? Answer with the label.", answer
    if kind == "least":
        answer = min(counts, key=counts.__getitem__)
        return "Which label is the least common among the questions? Answer with the label.", answer
    if kind == "count":
        return (
            f"How many questions are labelled '{label}'? Answer with a number.",
            str(counts[label]),
        )
    if kind == "user":
        askers = [u for u in stats.users if stats.by_user_label.get((u, label))]
        user = rng.choice(askers or list(stats.users))
        return (
            f"How many questions labelled '{label}' did user {user} ask? Answer with a number.",
            str(stats.by_user_label.get((user, label), 0)),
        )
    start = rng.randrange(YEARS * 12 - 6)
    length = rng.randint(3, 6)
    months = [(FIRST_YEAR + (start + i) // 12, 1 + (start + i) % 12) for i in range(length)]
    total = sum(stats.by_month_label.get((y, m, label), 0) for y, m in months)
    first, last = months[0], months[-1]
    return (
        f"How many questions labelled '{label}' were asked from {MONTHS[first[1] - 1]} "
        f"{first[0]} to {MONTHS[last[1] - 1]} {last[0]} inclusive? Answer with a number.",
        str(total),
    )


def _pairs_question(rng: random.Random, stats: Stats) -> tuple[str, str]:
    """A label and a threshold T that between 3 and 12 users reach, with a clear gap
    below them, so the set of pairs is well defined and small enough to list."""
    for label in rng.sample(LABELS, len(LABELS)):
        ranked = sorted(
            ((stats.by_user_label.get((u, label), 0), u) for u in stats.users), reverse=True
        )
        cuts = [
            k for k in range(3, min(12, len(ranked) - 1) + 1) if ranked[k - 1][0] > ranked[k][0]
        ]
        if cuts and ranked[cuts[0] - 1][0] > 0:
            k = rng.choice(cuts)
            threshold = ranked[k - 1][0]
            chosen = sorted(u for _c, u in ranked[:k])
            pairs = ", ".join(f"({a}, {b})" for a, b in combinations(chosen, 2))
            question = (
                f"List every pair of user IDs where both users asked at least {threshold} "
                f"questions labelled '{label}'. Give each pair once, the lower ID first, as "
                "(ID, ID) separated by commas."
            )
            return question, pairs
    raise ValueError("this size and seed give no pairs question; try another seed")


# --- scoring ---------------------------------------------------------------------------


def score_oolong(expected: str, answer: str) -> float:
    """A number scores 0.75 ** |error| (OOLONG's numeric score); a label 1 or 0."""
    if re.fullmatch(r"\d+", expected):
        found = re.search(r"-?\d+", re.sub(r"(?<=\d)[,_ ](?=\d{3})", "", answer or ""))
        return 0.75 ** abs(int(found.group()) - int(expected)) if found else 0.0
    said = " ".join((answer or "").lower().split())
    named = [label for label in LABELS if label in said]
    # "description" alone names the long label too; a list of labels is not an answer.
    return 1.0 if named == [expected] or said.strip(" .'\"") == expected else 0.0


def parse_pairs(text: str) -> set[frozenset[int]]:
    found = re.findall(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)", text or "")
    return {frozenset((int(a), int(b))) for a, b in found if a != b}


def score_pairs(expected: str, answer: str) -> float:
    """F1 of the answer's pairs against the expected ones (order within a pair is free)."""
    truth, said = parse_pairs(expected), parse_pairs(answer)
    if not truth and not said:
        return 1.0
    hits = len(truth & said)
    if not hits:
        return 0.0
    precision, recall = hits / len(said), hits / len(truth)
    return 2 * precision * recall / (precision + recall)
