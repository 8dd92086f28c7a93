"""Known-answer probes (gold questions) mixed into a batch's real work (issue 23).

A probe is an extractive question whose answer the conductor knows: a few sentences and
"Which sentence mentions W?", where W is a word that only one of them holds; the answer is
that sentence, as written. Its sentences come from the run's own context where it can (the
text of the batch's own prompts, so a probe reads like the work around it), and from a
probe bank otherwise (sentences made up from word lists, each with a number no other
sentence has). Plain functions: nothing here dispatches or emits.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from workers.agreement import normalise_exact

_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_TEXT_LABEL = re.compile(r"^(?:TEXT|EXCERPT):[ \t]*\n?", re.MULTILINE)
_LABEL_LINE = re.compile(r"^[A-Z][A-Z ]*:")  # QUESTION: ..., PARTIAL ANSWERS:, DRAFT ANSWER:
# The words of the question itself: a sentence holding one of them could tie with the answer.
_ASK_WORDS = frozenset({"which", "sentence", "mentions"})
SENTENCES = 4  # per probe: the answer and three others
MAX_SENTENCE_CHARS = 300

_ADJECTIVES = ("red", "quiet", "narrow", "old", "bright", "hollow", "green", "tall", "cold")
_THINGS = ("lantern", "bridge", "mill", "tower", "gate", "barn", "well", "chapel", "dock")
_PLACES = ("harbour", "valley", "market", "forest", "square", "ridge", "meadow", "canal")


@dataclass(frozen=True)
class Probe:
    prompt: str
    answer: str
    source: str  # "context" (the batch's own text) or "bank"
    others: tuple[str, ...] = ()  # the probe's other sentences: naming one is wrong
    why: str = ""  # why it was sent: a new worker's warm-up, or the batch's sample


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _text_to_read(prompt: str) -> str:
    """The part of a prompt that is text to read: after its TEXT: or EXCERPT: label when it
    has one (the program's instructions above it are not), else after its first line."""
    label = _TEXT_LABEL.search(prompt)
    if label is not None:
        return prompt[label.end() :]
    return prompt.strip().partition("\n")[2]


def _text_of(text: str) -> list[str]:
    """The lines of `text` that are text to read, not the program's: a labelled block
    ("QUESTION: ...", "DRAFT ANSWER: ...") runs from its label to the next blank line, as
    the simulated reader takes it (workers/sim/reader.py), and a combine prompt's partial
    answers to the end. The sentences after the first of a combine prompt's QUESTION
    ("How many ...? Count each ...") made probes that honest workers failed, and were
    counted as liars for it (a review)."""
    kept: list[str] = []
    in_block = False
    for line in text.splitlines():
        bare = line.strip()
        if bare.startswith("PARTIAL ANSWERS:"):
            break
        if _LABEL_LINE.match(bare):
            in_block = True
        elif not bare:
            in_block = False
        elif not in_block and not bare.startswith("- "):
            kept.append(line)
    return kept


def sentences_of(prompts: Sequence[str]) -> list[str]:
    """The distinct sentences of the text the batch's prompts give to read, short enough to
    quote. A fragment marker is not text: the worker reads the context in its place, so a
    sentence quoting one (or a label line such as "QUESTION: ...") could never be given back
    by an honest worker."""
    found: dict[str, None] = {}
    for prompt in prompts:
        for line in _text_of(_text_to_read(prompt)):
            for sentence in _SENTENCE.split(line):
                sentence = sentence.strip()
                if (
                    3 <= len(sentence) <= MAX_SENTENCE_CHARS
                    and "<<frlm:" not in sentence
                    and not _words(sentence) & _ASK_WORDS
                ):
                    found[sentence] = None
    return list(found)


def _compose(pool: list[str], rng: random.Random) -> tuple[list[str], str, str] | None:
    """(sentences, answer, word) from up to SENTENCES sentences of `pool`, or None when no
    sentence among those drawn has a word of its own."""
    chosen = rng.sample(pool, min(SENTENCES, len(pool)))
    order = list(range(len(chosen)))
    rng.shuffle(order)
    for i in order:
        others = set().union(*(_words(s) for j, s in enumerate(chosen) if j != i))
        own = sorted(w for w in _words(chosen[i]) - others if len(w) > 1 or w.isdigit())
        if own:
            return chosen, chosen[i], rng.choice(own)
    return None


def bank_sentences(rng: random.Random, n: int = SENTENCES) -> list[str]:
    """Made-up sentences, each with a number of its own."""
    numbers = rng.sample(range(10, 1000), n)
    return [
        f"The {rng.choice(_ADJECTIVES)} {rng.choice(_THINGS)} stands by the "
        f"{rng.choice(_PLACES)} at mile {number}."
        for number in numbers
    ]


def make_probe(prompts: Sequence[str], rng: random.Random) -> Probe:
    """One probe, from the batch's own text when it has at least two sentences to choose
    from, else from the bank."""
    pool = sentences_of(prompts)
    if len(pool) >= 2:
        composed = _compose(pool, rng)
        if composed is not None:
            return _probe(*composed, source="context")
    return _probe(*_compose(bank_sentences(rng), rng) or ([], "", ""), source="bank")


def _probe(sentences: list[str], answer: str, word: str, *, source: str) -> Probe:
    return Probe(
        prompt=f"Which sentence mentions {word}?\n" + "\n".join(sentences),
        answer=answer,
        source=source,
        others=tuple(s for s in sentences if s != answer),
    )


def _bare(text: str) -> str:
    return normalise_exact(text).strip("\"'`“”‘’ ").rstrip(".!?")


def probe_passed(probe: Probe, reply: str) -> bool:
    """Whether a reply gives the probe's known answer: it holds the answer sentence (quoted,
    with or without its full stop, inside a longer reply) and none of the others. Near
    misses fail: the other sentences may differ from the answer in one word only."""
    said = _bare(reply)
    if not said or _bare(probe.answer) not in said:
        return False
    return not any(_bare(other) in said for other in probe.others if other)


def probe_count(batch_size: int, rate: float, rng: random.Random) -> int:
    """How many probes to mix into a batch of this size at `rate`: the expected share,
    the fraction settled by a draw so small batches get probes too."""
    expected = batch_size * rate
    return int(expected) + (1 if rng.random() < expected - int(expected) else 0)
