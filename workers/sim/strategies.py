"""The simulated root model's strategies: which program answers a question, filled in for
the conversation's limits, with a smaller retry and the answer when nothing is found.

Chosen from the question:
- needle: "special magic number for KEY"; chunked search over llm_query_batched (all the
  values found when the question asks for all of them);
- records: OOLONG-style questions over dated user records; workers label and count their
  fragment's records, the program adds the counts up and answers in Python;
- generic: chunked map over llm_query_batched, then one llm_query to merge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workers.sim.conversation import Conversation, Limits
from workers.sim.programs import (
    GENERIC_PROGRAM,
    GENERIC_RETRY,
    MULTI_NEEDLE_PROGRAM,
    NEEDLE_PROGRAM,
    NEEDLE_RETRY,
    RECORDS_PROGRAM,
)
from workers.sim.reader import NeedleQuestion, content_words, parse_needle_question

MIN_SPAN = 24_000  # characters per chunk at least: fewer, fuller sub-queries
MIN_RECORDS_SPAN = 16_000  # records per fragment: a worker labels each one, so fewer chars
OVERLAP = 200  # longer than any needle sentence, so one cut across it leaves it whole

NOT_FOUND = "The key was not found in the context."
NO_HELP = "No part of the context answers the question."


@dataclass(frozen=True)
class Strategy:
    first: tuple[str, str]  # (prose, code) for turn 1
    retry: tuple[str, str]  # a smaller program for when the first one raised
    empty_answer: str  # the final answer when the program found nothing


def strategy_for(conversation: Conversation) -> Strategy:
    """The strategy for the conversation's question."""
    records = parse_records_question(conversation.question)
    if records is not None:
        return _records_strategy(records, conversation.limits)
    needle = parse_needle_question(conversation.question)
    if needle is not None:
        if _ALL_VALUES.search(conversation.question):
            return _multi_needle_strategy(needle, conversation.limits)
        return _needle_strategy(needle, conversation.limits)
    return _generic_strategy(conversation.question, conversation.limits)


_ALL_VALUES = re.compile(r"\ball the special magic|\bevery one of them\b", re.IGNORECASE)
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class RecordsQuestion:
    kind: str  # most | least | count | user | timeline | pairs
    label: str | None = None
    user: str | None = None
    months: tuple[str, ...] = ()  # "YYYY-MM" keys of a timeline question
    threshold: int = 0


def parse_records_question(question: str) -> RecordsQuestion | None:
    """What an OOLONG-style question over "Date || User || Instance" records asks."""
    if "each line consists of a date, a user id and a question" not in question.lower():
        return None
    if m := re.search(r"at least (\d+) questions labelled '([^']+)'", question):
        return RecordsQuestion("pairs", label=m[2], threshold=int(m[1]))
    if re.search(r"\bmost common\b", question):
        return RecordsQuestion("most")
    if re.search(r"\bleast common\b", question):
        return RecordsQuestion("least")
    if m := re.search(r"labelled '([^']+)' did user (\d+) ask", question):
        return RecordsQuestion("user", label=m[1], user=m[2])
    if m := re.search(
        r"labelled '([^']+)' were asked from (\w{3}) (\d{4}) to (\w{3}) (\d{4})", question
    ):
        first = int(m[3]) * 12 + _MONTH_NAMES.index(m[2])
        last = int(m[5]) * 12 + _MONTH_NAMES.index(m[4])
        months = tuple(f"{at // 12}-{at % 12 + 1:02d}" for at in range(first, last + 1))
        return RecordsQuestion("timeline", label=m[1], months=months)
    if m := re.search(r"How many questions are labelled '([^']+)'", question):
        return RecordsQuestion("count", label=m[1])
    return None


def records_prompt_header(ask: RecordsQuestion) -> str:
    labels = (
        "abbreviation | entity | description and abstract concept | human being | location | "
        "numeric value"
    )
    group = {"pairs": "user", "timeline": "month", "user": "label"}.get(ask.kind, "label")
    only = f" labelled '{ask.label}'" if ask.kind in ("pairs", "timeline") else ""
    only += f" of user {ask.user}" if ask.kind == "user" else ""
    return (
        f"Label each question in the records below as one of: {labels}. Then count the "
        f"records{only} by {group}. Reply with one line per {group}: the {group}, a colon, "
        "and the count.\n\nRECORDS:\n"
    )


def _records_finish(ask: RecordsQuestion) -> str:
    if ask.kind == "most":
        return "answer = max(totals, key=totals.get) if totals else None"
    if ask.kind == "least":
        return "answer = min(totals, key=totals.get) if totals else None"
    if ask.kind in ("count", "user"):
        return f"answer = totals.get({ask.label!r}, 0)"
    if ask.kind == "timeline":
        return f"answer = sum(totals.get(month, 0) for month in {list(ask.months)!r})"
    return (
        f"users = sorted(int(u) for u, n in totals.items() if n >= {ask.threshold})\n"
        'answer = ", ".join(f"({a}, {b})" for i, a in enumerate(users) for b in users[i + 1:])'
        " or None"
    )


def _records_strategy(ask: RecordsQuestion, limits: Limits) -> Strategy:
    batch = batch_size(limits)
    header, finish = repr(records_prompt_header(ask)), _records_finish(ask)
    code = RECORDS_PROGRAM.substitute(
        batch=batch, min_span=MIN_RECORDS_SPAN, header=header, finish=finish
    )
    retry = RECORDS_PROGRAM.substitute(
        batch=min(batch, 8), min_span=MIN_RECORDS_SPAN, header=header, finish=finish
    )
    return Strategy(
        first=(
            f"The records do not state their labels, so one worker per fragment of "
            f"{_context_words(limits)} labels and counts its records (at most {batch} "
            "fragments cut on line boundaries, one batch); I add the counts up in Python.",
            code,
        ),
        retry=("That program failed. I will retry with fewer, larger fragments.", retry),
        empty_answer=NO_HELP,
    )


def _multi_needle_strategy(needle: NeedleQuestion, limits: Limits) -> Strategy:
    batch = batch_size(limits)
    header = (
        f"Find every special magic {needle.kind} for '{needle.key}' in the text below. Reply "
        f"with all of them separated by commas, or NONE if there is none.\n\nTEXT:\n"
    )
    first = MULTI_NEEDLE_PROGRAM.substitute(
        batch=batch,
        min_span=MIN_SPAN,
        overlap=OVERLAP,
        header=repr(header),
        parts="chunks",
        what="chunks mention the key",
    )
    return Strategy(
        first=(
            f"I will look for every special magic {needle.kind} for '{needle.key}' in at most "
            f"{batch} overlapping chunks, one worker per chunk, and keep all distinct values.",
            first,
        ),
        retry=(
            "That program failed. I will retry with fewer chunks.",
            MULTI_NEEDLE_PROGRAM.substitute(
                batch=min(batch, 8),
                min_span=MIN_SPAN,
                overlap=OVERLAP,
                header=repr(header),
                parts="chunks",
                what="chunks mention the key",
            ),
        ),
        empty_answer=NOT_FOUND,
    )


def batch_size(limits: Limits, other_calls: int = 0) -> int:
    """Chunks per batch: never over max_batch, nor over what max_subqueries leaves."""
    size = limits.max_batch
    if limits.max_subqueries is not None:
        size = min(size, limits.max_subqueries - other_calls)
    return max(1, size)


def _context_words(limits: Limits) -> str:
    if limits.context_chars is None:
        return "the context"
    return f"the {limits.context_chars:,}-character context"


def needle_prompt_header(needle: NeedleQuestion) -> str:
    return (
        f"Find the special magic {needle.kind} for '{needle.key}' in the text below. "
        f"Reply with the {needle.kind} only, or NONE if it is not there.\n\nTEXT:\n"
    )


def generic_prompt_header(question: str) -> str:
    return (
        "Answer the question using only the excerpt below. Reply NONE if the excerpt "
        f"does not help.\n\nQUESTION: {question}\n\nEXCERPT:\n"
    )


def combine_prompt_header(question: str) -> str:
    return (
        "Combine these partial answers into one answer to the question.\n\n"
        f"QUESTION: {question}\n\nPARTIAL ANSWERS:\n"
    )


def _needle_strategy(needle: NeedleQuestion, limits: Limits) -> Strategy:
    batch = batch_size(limits)
    header = needle_prompt_header(needle)
    first = NEEDLE_PROGRAM.substitute(
        batch=batch,
        min_span=MIN_SPAN,
        overlap=OVERLAP,
        header=repr(header),
        parts="chunks",
        what="chunks mention the key",
    )
    retry = NEEDLE_RETRY.substitute(
        batch=min(batch, 8),
        key=repr(needle.key),
        header=repr(header),
        parts="windows",
        what="windows mention the key",
    )
    return Strategy(
        first=(
            f"I will look for the special magic {needle.kind} for '{needle.key}' by cutting "
            f"{_context_words(limits)} into at most {batch} overlapping chunks and asking "
            "one worker about each chunk, all in one batch.",
            first,
        ),
        retry=(
            "That program failed. I will retry with a smaller one that reads only the text "
            "around each place where the key occurs.",
            retry,
        ),
        empty_answer=NOT_FOUND,
    )


def _generic_strategy(question: str, limits: Limits) -> Strategy:
    batch = batch_size(limits, other_calls=1)
    header = generic_prompt_header(question)
    first = GENERIC_PROGRAM.substitute(
        batch=batch,
        min_span=MIN_SPAN,
        overlap=OVERLAP,
        header=repr(header),
        combine=repr(combine_prompt_header(question)),
        parts="chunks",
        what="chunks help",
    )
    retry = GENERIC_RETRY.substitute(
        batch=batch,
        few=min(batch, 4),
        min_span=MIN_SPAN,
        overlap=OVERLAP,
        header=repr(header),
        words=repr(sorted(content_words(question))),
        parts="ranked",
        what="chunks help",
    )
    return Strategy(
        first=(
            f"I will cut {_context_words(limits)} into at most {batch} overlapping chunks, "
            "ask one worker per chunk to answer from its excerpt alone, and merge the useful "
            "answers with one more call.",
            first,
        ),
        retry=(
            "That program failed. I will retry with a smaller one that sends only the few "
            "chunks sharing most words with the question.",
            retry,
        ),
        empty_answer=NO_HELP,
    )
