"""The simulated WORKER model (`frlm-sim-worker`): it answers a sub-query by reading the
fragment in its prompt, so a run's answer is right only if the root program sent the
right fragments to the right prompts.

It knows the prompt shapes the simulated root model and the REPL's program patterns write:
- needle: "... special magic number for 'KEY' ... TEXT:\\n<fragment>" -> the value or NONE;
- combine: "Combine these partial answers ... PARTIAL ANSWERS:\\n- a\\n- b" -> the most common;
- count: "Label each question in the records below ... count the records ... by G" -> one
  "key: count" line per group, after labelling each record by what its question asks;
- score: "Score from 0 to 10 how likely the excerpt ..." -> a number;
- refine: "Improve the draft answer ... DRAFT ANSWER: d ... EXCERPT:" -> a better answer or SAME;
- summarise: "Summarise the text below ..." -> the lines that report results;
- source: "which module defines X", "the value of the constant C" over modules under file
  headers (workers.sim.source);
- anything else: the fragment sentence sharing most content words with the question.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from workers.sim import ChatMessage
from workers.sim.source import source_answer

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
    head = prompt.lstrip()[:80].lower()
    if head.startswith("label each question in the records"):
        return count_records(prompt)
    if head.startswith("summarise the text below"):
        return summarise(_split_prompt(prompt)[1])
    if head.startswith("score from 0 to 10"):
        return str(score_excerpt(*_question_and_excerpt(prompt)))
    if head.startswith("improve the draft answer"):
        return refine_draft(prompt)
    instruction, fragment = _split_prompt(prompt)
    needle = parse_needle_question(instruction)
    if needle is not None:
        return find_needle(fragment, needle) or NONE
    partials = _partial_answers(prompt)
    if partials is not None:
        return _most_common(partials) or NONE
    question, excerpt = _question_and_excerpt(prompt)
    from_source = source_answer(question, excerpt)
    if from_source is not None:
        return from_source or NONE
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
        # Nothing else in the text to pass off: make something up. Independent liars make
        # up different things (their RNGs differ); colluding ones would share a seed.
        return f"The answer is {rng.randint(1000, 9999)}."
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


# --- records (OOLONG-style) --------------------------------------------------------------

RECORD = re.compile(
    r"^Date: (?P<month>\w{3}) \d{2}, (?P<year>\d{4}) \|\| User: (?P<user>\d+) \|\| "
    r"Instance: (?P<text>.*)$",
    re.MULTILINE,
)
_COUNT_ASK = re.compile(
    r"count the records(?: labelled '(?P<label>[^']+)')?(?: of user (?P<user>\d+))? "
    r"by (?P<group>label|user|month)",
    re.IGNORECASE,
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
LABELS = (
    "abbreviation",
    "entity",
    "description and abstract concept",
    "human being",
    "location",
    "numeric value",
)


def classify(question: str) -> str:
    """The coarse category of a question, from how it is asked (TREC's six classes)."""
    text = question.strip().lower()
    if "stand for" in text or "abbreviation" in text:
        return "abbreviation"
    if text.startswith("who "):
        return "human being"
    if text.startswith(("where ", "which city", "which country", "what city", "what country")):
        return "location"
    if text.startswith(("how many", "how much", "when ", "what year", "how long", "how far")):
        return "numeric value"
    if text.startswith(("why ", "how does", "how do ", "what is the meaning", "describe ")):
        return "description and abstract concept"
    return "entity"


def count_records(prompt: str) -> str:
    """Label every record of the fragment and count them as the prompt asks."""
    ask = _COUNT_ASK.search(prompt)
    if ask is None:
        return NONE
    _head, _marker, records = prompt.partition("RECORDS:")
    group, label, user = ask["group"].lower(), ask["label"], ask["user"]
    counts: dict[str, int] = dict.fromkeys(LABELS, 0) if group == "label" else {}
    for record in RECORD.finditer(records):
        kind = classify(record["text"])
        if (label is not None and kind != label) or (user is not None and record["user"] != user):
            continue
        if group == "label":
            key = kind
        elif group == "user":
            key = record["user"]
        else:
            key = f"{record['year']}-{_MONTHS.index(record['month'].lower()) + 1:02d}"
        counts[key] = counts.get(key, 0) + 1
    return "\n".join(f"{key}: {count}" for key, count in sorted(counts.items())) or NONE


# --- patterns and folding ---------------------------------------------------------------

_DRAFT = re.compile(r"^DRAFT ANSWER:[ \t]*(.*)$", re.MULTILINE)


def score_excerpt(question: str, excerpt: str) -> int:
    """0 to 10: 10 when the excerpt states what a needle question asks, else how many of
    the question's words the excerpt's best sentence shares."""
    needle = parse_needle_question(question)
    if needle is not None:
        return 10 if find_needle(excerpt, needle) else 0
    best = best_sentence(question, excerpt)
    if best is None:
        return 0
    return min(9, len(content_words(question) & content_words(best)))


def refine_draft(prompt: str) -> str:
    """A better answer than the draft from this excerpt, or SAME."""
    question, excerpt = _question_and_excerpt(prompt)
    draft_match = _DRAFT.search(prompt)
    draft = draft_match[1].strip() if draft_match else ""
    needle = parse_needle_question(question)
    if needle is not None:
        found = find_needle(excerpt, needle)
        return found if found and found != draft else "SAME"
    best = best_sentence(question, excerpt)
    wanted = content_words(question)
    if best is None or len(wanted & content_words(best)) <= len(wanted & content_words(draft)):
        return "SAME"
    return best


def summarise(text: str, keep: int = 4) -> str:
    """The lines that report something (a result, an answer, an error), at most ``keep``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [
        line
        for line in lines
        if re.search(r"answer|result|error|found|\d", line, re.IGNORECASE)
        and not line.startswith(("[", "```"))
    ]
    chosen = list(dict.fromkeys(telling or lines))[-keep:]
    return "\n".join(line[:300] for line in chosen) or NONE
