"""The simulated ROOT model (`frlm-sim-root`): it reads the conversation the conductor
writes and replies with prose and one ```repl block of real Python, as an RLM root does.

What it understands of the conversation (anything else is ignored, so the conductor's
wording can change freely):
- in the system message, `Context: str of N characters` and
  `Limits: max_batch=B, max_subqueries=S, ...`;
- the first user message starting `Question:` (else the first user message);
- every later user message is a REPL result; its text is what sits between the first
  and the last ``` fence.

Behaviours, chosen from the question:
- scripted: the question carries ```repl blocks; turn k replies with block k;
- needle: "special magic number for KEY"; chunked search over llm_query_batched (all the
  values found when the question asks for all of them);
- records: OOLONG-style questions over dated user records; workers label and count their
  fragment's records, the program adds the counts up and answers in Python;
- generic: chunked map over llm_query_batched, then one llm_query to merge.

Programs send fragments (context.chunks), not text: each prompt carries a reference that
the worker reads from the file, so the REPL and the conductor never hold the chunks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from string import Template

from workers.sim import ChatMessage
from workers.sim.reader import NeedleQuestion, content_words, parse_needle_question

MIN_SPAN = 24_000  # characters per chunk at least: fewer, fuller sub-queries
MIN_RECORDS_SPAN = 16_000  # records per fragment: a worker labels each one, so fewer chars
OVERLAP = 200  # longer than any needle sentence, so one cut across it leaves it whole
DEFAULT_MAX_BATCH = 16
RETRY_MARK = "# Retry:"
FAILED_PREFIX = "[frlm:"

NOT_FOUND = "The key was not found in the context."
NO_HELP = "No part of the context answers the question."
NO_ANSWER = "No answer could be determined from the REPL outputs."


@dataclass(frozen=True)
class Limits:
    context_chars: int | None
    max_batch: int
    max_subqueries: int | None


@dataclass(frozen=True)
class Conversation:
    limits: Limits
    question: str
    turn: int  # assistant messages so far + 1
    replies: tuple[str, ...]  # the root's earlier replies
    outputs: tuple[str, ...]  # REPL outputs, oldest first
    asks_for_final: bool


@dataclass(frozen=True)
class Summary:
    """The line a generated program prints last: `... ; answer: X`."""

    answer: str | None


@dataclass(frozen=True)
class Strategy:
    first: tuple[str, str]  # (prose, code) for turn 1
    retry: tuple[str, str]  # a smaller program for when the first one raised
    empty_answer: str  # the final answer when the program found nothing


def root_reply(messages: Sequence[ChatMessage]) -> str:
    """The root model's next reply."""
    conversation = parse_conversation(messages)
    blocks = scripted_blocks(conversation.question)
    if blocks:
        return _scripted_reply(conversation, blocks)
    strategy = _strategy(conversation)
    if conversation.asks_for_final:
        return final_line(best_guess(conversation.outputs, strategy.empty_answer))
    if conversation.turn == 1:
        return code_reply(*strategy.first)
    return _follow_up(conversation, strategy)


# --- reading the conversation ---------------------------------------------------------


def parse_conversation(messages: Sequence[ChatMessage]) -> Conversation:
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    asked = [i for i in users if messages[i]["content"].lstrip().startswith("Question:")]
    question_at = (asked or users or [len(messages)])[0]
    question = ""
    if question_at < len(messages):
        question = messages[question_at]["content"].strip()
        question = question.removeprefix("Question:").strip()
    later = messages[question_at + 1 :]
    last = messages[-1] if messages else None
    asks_for_final = bool(
        last is not None
        and last["role"] == "user"
        and len(messages) - 1 != question_at
        and "final answer" in _outside_fence(last["content"]).lower()
    )
    return Conversation(
        limits=parse_limits(system),
        question=question,
        turn=1 + sum(1 for m in messages if m["role"] == "assistant") + _folded_turns(messages),
        replies=tuple(m["content"] for m in messages if m["role"] == "assistant"),
        # Only REPL results count as outputs; a nudge from the conductor is not one.
        outputs=tuple(
            repl_text(m["content"])
            for m in later
            if m["role"] == "user" and m["content"].lstrip().startswith("REPL output")
        ),
        asks_for_final=asks_for_final,
    )


_FOLDED = re.compile(r"^Earlier turns, folded \((\d+) root turns?", re.MULTILINE)


def _folded_turns(messages: Sequence[ChatMessage]) -> int:
    """Turns the conductor folded into a summary message still count as taken."""
    return sum(
        int(found[1])
        for m in messages
        if m["role"] == "user"
        for found in _FOLDED.finditer(m["content"])
    )


def parse_limits(system: str) -> Limits:
    context = re.search(r"Context:\s*str of\s*([\d,_]+)\s*characters", system)
    batch = re.search(r"max_batch\s*=\s*(\d+)", system)
    subqueries = re.search(r"max_subqueries\s*=\s*(\d+)", system)
    return Limits(
        context_chars=int(re.sub(r"[,_]", "", context[1])) if context else None,
        max_batch=max(1, int(batch[1])) if batch else DEFAULT_MAX_BATCH,
        max_subqueries=int(subqueries[1]) if subqueries else None,
    )


def repl_text(content: str) -> str:
    """The output inside a `REPL output (cell K):` message (first to last fence)."""
    opening = content.find("```")
    if opening == -1:
        return re.sub(r"\A\s*REPL output[^\n]*\n?", "", content).strip("\n")
    newline = content.find("\n", opening)
    start = len(content) if newline == -1 else newline + 1
    closing = content.rfind("```")
    end = closing if closing >= start else len(content)
    return content[start:end].strip("\n")


def _outside_fence(content: str) -> str:
    opening = content.find("```")
    closing = content.rfind("```")
    if opening == -1 or closing == opening:
        return content
    return content[:opening] + content[closing + 3 :]


def scripted_blocks(question: str) -> list[str]:
    return [b.rstrip("\n") for b in re.findall(r"```repl[ \t]*\n(.*?)```", question, re.DOTALL)]


_SUMMARY = re.compile(r"^\d+ of \d+ \w+ [^\n]*?; answer: (?P<answer>[^\n]*)$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*)?(?:Error|Exception)\b:?.*$", re.MULTILINE)


def parse_summary(output: str) -> Summary | None:
    found = list(_SUMMARY.finditer(output))
    if not found:
        return None
    answer = found[-1]["answer"].strip()
    return Summary(answer=None if answer in ("", "None") else answer)


def error_line(output: str) -> str | None:
    """The last line naming an exception, if the output shows one."""
    errors = _ERROR_LINE.findall(output)
    if errors:
        return errors[-1].strip()
    if "Traceback (most recent call last)" in output:
        return last_line([output]) or "a traceback"
    return None


def last_line(outputs: Sequence[str]) -> str:
    for output in reversed(outputs):
        for line in reversed(output.splitlines()):
            if line.strip():
                return line.strip()
    return ""


def best_guess(outputs: Sequence[str], empty_answer: str) -> str:
    for output in reversed(outputs):
        summary = parse_summary(output)
        if summary is not None:
            return summary.answer or empty_answer
    line = last_line(outputs)
    if not line or error_line(line):
        return NO_ANSWER
    return line


# --- replying --------------------------------------------------------------------------


def code_reply(prose: str, code: str) -> str:
    return f"{prose}\n\n```repl\n{code.rstrip()}\n```"


def final_line(answer: str) -> str:
    # The text protocol wants FINAL(...) on one line.
    return f"FINAL({' '.join(answer.split())})"


def _scripted_reply(conversation: Conversation, blocks: list[str]) -> str:
    turn = conversation.turn
    if conversation.asks_for_final or turn > len(blocks):
        return final_line(last_line(conversation.outputs))
    return code_reply(f"Running step {turn} of {len(blocks)} from the question.", blocks[turn - 1])


def _follow_up(conversation: Conversation, strategy: Strategy) -> str:
    last = conversation.outputs[-1] if conversation.outputs else ""
    summary = parse_summary(last)
    error = error_line(last) if summary is None else None
    retried = any(RETRY_MARK in reply for reply in conversation.replies)
    if conversation.turn == 2 or (conversation.turn == 3 and retried):
        if summary is not None:
            return _finish(summary, strategy.empty_answer)
        if error is not None and not retried:
            return code_reply(*strategy.retry)
        if error is not None:
            return final_line(
                f"No answer: the program failed, and so did a smaller retry ({error})."
            )
    return final_line(best_guess(conversation.outputs, strategy.empty_answer))


def _finish(summary: Summary, empty_answer: str) -> str:
    if summary.answer is not None:
        return code_reply("The program found an answer; returning it.", 'FINAL_VAR("answer")')
    # json.dumps writes a valid, double-quoted Python string literal.
    code = f"FINAL({json.dumps(empty_answer, ensure_ascii=False)})"
    return code_reply("Nothing useful came back from the chunks.", code)


# --- programs ---------------------------------------------------------------------------


def _strategy(conversation: Conversation) -> Strategy:
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
    code = _RECORDS_PROGRAM.substitute(
        batch=batch, min_span=MIN_RECORDS_SPAN, header=header, finish=finish
    )
    retry = _RECORDS_PROGRAM.substitute(
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
    first = _MULTI_NEEDLE_PROGRAM.substitute(
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
            _MULTI_NEEDLE_PROGRAM.substitute(
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


# Each program is assembled from these parts; `$name` fields are filled with repr()'d
# values, so nothing the user typed is ever pasted into code unquoted.

_CHUNKING = r"""
span = max($min_span, -(-len(context) // $batch))
chunks = context.chunks(span + $overlap, overlap=$overlap)
"""

_ASK = r"""
prompts = [header + part for part in $parts]
replies = [str(reply) for reply in llm_query_batched(prompts)] if prompts else []
failed = [reply for reply in replies if reply.startswith("[frlm:")]
found = [reply.strip() for reply in replies if not reply.startswith("[frlm:")]
found = [reply for reply in found if reply and reply.rstrip(".").upper() != "NONE"]
"""

_VOTE = r"""
votes = {}
for reply in found:
    votes[reply] = votes.get(reply, 0) + 1
answer = max(votes, key=votes.get) if votes else None
"""

_REPORT = r"""
print(f"{len(found)} of {len($parts)} $what; failed: {len(failed)}; answer: {answer}")
"""


def _program(*parts: str) -> Template:
    return Template("".join(part.lstrip("\n") for part in parts))


_NEEDLE_PROGRAM = _program(
    r"""
# Needle search: cut the context into at most $batch overlapping chunks and ask one
# worker per chunk, all in one batch. A failed sub-query is a string "[frlm:...]".
header = $header
""",
    _CHUNKING,
    _ASK,
    r"""
found = [reply.rstrip(".") for reply in found]
""",
    _VOTE,
    _REPORT,
)

_NEEDLE_RETRY = _program(
    r"""
# Retry: a smaller program. Plain Python finds where the key occurs, and only the
# text around those places goes to the workers.
key = $key
header = $header
starts = []
at = context.find(key)
while at != -1 and len(starts) < $batch:
    starts.append(max(0, at - 2000))
    at = context.find(key, at + len(key))
windows = [context.fragment(start, start + 4000) for start in starts]
""",
    _ASK,
    r"""
found = [reply.rstrip(".") for reply in found]
""",
    _VOTE,
    _REPORT,
)

_UNION = r"""
values = []
for reply in found:
    for value in reply.split(","):
        value = value.strip().rstrip(".")
        if value and value not in values:
            values.append(value)
answer = ", ".join(values) if values else None
"""

_MULTI_NEEDLE_PROGRAM = _program(
    r"""
# Multi-needle search: cut the context into at most $batch overlapping chunks, ask one
# worker per chunk for every value stated for the key, and keep all distinct values.
header = $header
""",
    _CHUNKING,
    _ASK,
    _UNION,
    _REPORT,
)

_RECORDS_PROGRAM = _program(
    r"""
# Records: cut the context on line boundaries into at most $batch fragments (no overlap,
# so no record is counted twice), ask one worker per fragment to label its records and
# count them, then add the counts up here and answer in plain Python.
header = $header
span = max($min_span, -(-len(context) // $batch))
parts = context.chunks(span, snap="\n")
replies = [str(reply) for reply in llm_query_batched([header + part for part in parts])]
failed = [reply for reply in replies if reply.startswith("[frlm:")]
totals = {}
for reply in replies:
    if reply.startswith("[frlm:"):
        continue
    for line in reply.splitlines():
        key, sep, count = line.rpartition(":")
        if sep and count.strip().isdigit():
            totals[key.strip()] = totals.get(key.strip(), 0) + int(count)
""",
    "$finish\n",
    r"""
counted = len(replies) - len(failed)
print(f"{counted} of {len(parts)} fragments counted; failed: {len(failed)}; answer: {answer}")
""",
)

_GENERIC_PROGRAM = _program(
    r"""
# Map-reduce: one worker per overlapping chunk answers from its excerpt alone (at most
# $batch chunks, one batch), then one more call merges the useful partial answers.
header = $header
combine = $combine
""",
    _CHUNKING,
    _ASK,
    r"""
answer = None
if found:
    answer = str(llm_query(combine + "\n".join("- " + " ".join(f.split()) for f in found)))
    if answer.startswith("[frlm:"):
        # The merge failed; one partial answer is better than none.
        answer = found[0]
""",
    _REPORT,
)

_GENERIC_RETRY = _program(
    r"""
# Retry: a smaller program. Plain Python ranks the chunks by how often the question's
# words occur in them; only the best $few go to the workers, and there is no merge call.
header = $header
words = $words
""",
    _CHUNKING,
    r"""
ranked = sorted(chunks, key=lambda chunk: -sum(chunk.text().lower().count(w) for w in words))
ranked = ranked[:$few]
""",
    _ASK,
    _VOTE,
    _REPORT,
)


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
    first = _NEEDLE_PROGRAM.substitute(
        batch=batch,
        min_span=MIN_SPAN,
        overlap=OVERLAP,
        header=repr(header),
        parts="chunks",
        what="chunks mention the key",
    )
    retry = _NEEDLE_RETRY.substitute(
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
    first = _GENERIC_PROGRAM.substitute(
        batch=batch,
        min_span=MIN_SPAN,
        overlap=OVERLAP,
        header=repr(header),
        combine=repr(combine_prompt_header(question)),
        parts="chunks",
        what="chunks help",
    )
    retry = _GENERIC_RETRY.substitute(
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
