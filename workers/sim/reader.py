"""The simulated WORKER model (`frlm-sim-worker`): it answers a sub-query by reading the
fragment in its prompt, so a run's answer is right only if the root program sent the
right fragments to the right prompts.

It knows three prompt shapes, the ones the simulated root model writes:
- needle: "... special magic number for 'KEY' ... TEXT:\\n<fragment>" -> the value or NONE;
- combine: "Combine these partial answers ... PARTIAL ANSWERS:\\n- a\\n- b" -> the most common;
- anything else: the fragment sentence sharing most content words with the question.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from workers.sim import ChatMessage

NONE = "NONE"

_KINDS = r"(?P<kind>number|value|word|uuid)s?"
_KEY = r"(?P<key>\w(?:[\w.\-]*\w)?)"
NEEDLE_QUESTION = re.compile(
    rf"special\s+magic\s+{_KINDS}\s+for\s+['\"\u2018\u201c]?{_KEY}", re.IGNORECASE
)
# What a value looks like, per kind, in the text "... for KEY is: VALUE."
_VALUE_PATTERNS = {
    "number": r"\d[\d,]*\d|\d",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "value": r"[^\s]+",
    "word": r"[^\s]+",
}
_TRAILING = ".,;:!?\"')]}\u2019\u201d"

_STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be been before being
    below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers him his how i if in into is it its just
    me more most my no nor not now of off on once only or other our out over own same she
    should so some such than that the their them then there these they this those through
    to too under until up very was we were what when where which while who whom why will
    with would you your mentioned provided text excerpt question""".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_FRAGMENT_MARKER = re.compile(r"^(?:TEXT|EXCERPT):[ \t]*\n?", re.MULTILINE)
_QUESTION_LINE = re.compile(r"^QUESTION:[ \t]*(.*?)\s*(?:\n\s*\n|\Z)", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class NeedleQuestion:
    kind: str  # number, value, word or uuid
    key: str


def parse_needle_question(text: str) -> NeedleQuestion | None:
    """The kind and key of a "special magic number for KEY" question, if it is one."""
    match = NEEDLE_QUESTION.search(text)
    if match is None:
        return None
    return NeedleQuestion(kind=match["kind"].lower(), key=match["key"])


def worker_reply(messages: Sequence[ChatMessage], liar: random.Random | None = None) -> str:
    """The worker's reply to a conversation: only the last user message matters. With a
    `liar` RNG the reply is a plausible wrong one (the profile's lie_rate chose this)."""
    prompt = _last_user_content(messages)
    return answer_prompt(prompt) if liar is None else wrong_answer(prompt, liar)


def answer_prompt(prompt: str) -> str:
    """The honest answer to one sub-query prompt."""
    instruction, fragment = _split_prompt(prompt)
    needle = parse_needle_question(instruction)
    if needle is not None:
        return find_needle(fragment, needle) or NONE
    partials = _partial_answers(prompt)
    if partials is not None:
        return _most_common(partials) or NONE
    question, excerpt = _question_and_excerpt(prompt)
    return best_sentence(question, excerpt) or NONE


def wrong_answer(prompt: str, rng: random.Random) -> str:
    """A plausible reply that is not the honest one: what a lying worker sends."""
    truth = answer_prompt(prompt)
    instruction, _fragment = _split_prompt(prompt)
    if parse_needle_question(instruction) is not None:
        while True:
            made_up = str(rng.randint(1_000_000, 9_999_999))
            if made_up != truth:
                return made_up
    partials = _partial_answers(prompt)
    if partials is not None:
        others = [answer for answer in dict.fromkeys(partials) if answer != truth]
    else:
        others = [s for s in _sentences(_question_and_excerpt(prompt)[1]) if s != truth]
    if not others:
        return NONE if truth != NONE else "The excerpt does not say."
    return rng.choice(others)


def find_needle(text: str, needle: NeedleQuestion) -> str | None:
    """The value(s) stated for exactly this key in `text`, comma-joined, else None."""
    pattern = re.compile(
        rf"special\s+magic\s+{needle.kind}s?\s+for\s+['\"\u2018\u201c]?{re.escape(needle.key)}"
        rf"['\"\u2019\u201d]?\s+(?:is|are)\s*:?\s*(?P<value>{_VALUE_PATTERNS[needle.kind]})",
        re.IGNORECASE,
    )
    values = [match["value"].rstrip(_TRAILING) for match in pattern.finditer(text)]
    distinct = [value for value in dict.fromkeys(values) if value]
    return ", ".join(distinct) or None


def best_sentence(question: str, excerpt: str) -> str | None:
    """The excerpt sentence sharing most content words with the question (first on ties)."""
    wanted = content_words(question)
    if not wanted:
        return None
    best: str | None = None
    best_overlap = 0
    for sentence in _sentences(excerpt):
        overlap = len(wanted & content_words(sentence))
        if overlap > best_overlap:
            best, best_overlap = sentence, overlap
    return best


def content_words(text: str) -> set[str]:
    return {word for word in _WORD.findall(text.lower()) if word not in _STOPWORDS}


def _last_user_content(messages: Sequence[ChatMessage]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            return message["content"]
    return messages[-1]["content"] if messages else ""


def _split_prompt(prompt: str) -> tuple[str, str]:
    """(instruction, fragment) around the first TEXT:/EXCERPT: line; without one, the
    whole prompt is both, so a free-form prompt is still read."""
    return _find_fragment(prompt) or (prompt, prompt)


def _find_fragment(prompt: str) -> tuple[str, str] | None:
    match = _FRAGMENT_MARKER.search(prompt)
    if match is None:
        return None
    return prompt[: match.start()], prompt[match.end() :]


def _question_and_excerpt(prompt: str) -> tuple[str, str]:
    found = _find_fragment(prompt)
    if found is None:
        # Free form: the first line is taken as the ask, the rest as what to read.
        first, _, rest = prompt.strip().partition("\n")
        return first, rest
    instruction, excerpt = found
    question = _QUESTION_LINE.search(instruction)
    return (question[1] if question else instruction), excerpt


def _partial_answers(prompt: str) -> list[str] | None:
    """The bullet list of a combine prompt, or None if this is not one."""
    if not prompt.lstrip().lower().startswith("combine these partial answers"):
        return None
    _head, marker, tail = prompt.partition("PARTIAL ANSWERS:")
    if not marker:
        return []
    return [line.strip()[2:].strip() for line in tail.splitlines() if line.strip().startswith("- ")]


def _most_common(answers: list[str]) -> str | None:
    counts: dict[str, int] = {}
    for answer in answers:
        counts[answer] = counts.get(answer, 0) + 1
    # max() keeps the first of equal counts, and dicts keep insertion order: ties go first.
    return max(counts, key=counts.__getitem__) if counts else None


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_BREAK.split(text) if s.strip()]
