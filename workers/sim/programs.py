"""The programs the simulated root model writes, kept as string templates: each is
assembled from shared parts, and a strategy (workers.sim.strategies) fills its `$name`
fields for the question at hand.

Programs send fragments (context.chunks), not text: each prompt carries a reference that
the worker reads from the file, so the REPL and the conductor never hold the chunks.
"""

from __future__ import annotations

from string import Template

RETRY_MARK = "# Retry:"  # opens a retry program: the root model tells a retried turn by it
FAILED_PREFIX = "[frlm:"  # starts what a failed sub-query returns to the program


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


NEEDLE_PROGRAM = _program(
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

NEEDLE_RETRY = _program(
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

MULTI_NEEDLE_PROGRAM = _program(
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

RECORDS_PROGRAM = _program(
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

GENERIC_PROGRAM = _program(
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

GENERIC_RETRY = _program(
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
