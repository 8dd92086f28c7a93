"""Program patterns the root model can call from the REPL: map-reduce over fragments,
recursive decomposition with a depth bound, iterative refinement with early exit, tree
search with scoring and pruning.

Standard library only: it runs inside the sandbox beside child.py. Every pattern is made of
batches of llm_query_batched (and rlm_query): the sub-queries of one step go out together
through the conductor's fanout, under its quorum, retries, limits and tracing, never one
after another in a loop here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

PATTERNS = ("map_reduce", "decompose", "refine", "tree_search")
FAILED = "[frlm:"
NONE = "NONE"
# What map_reduce answers when no fragment's reply helps: a run's FINAL of None said "None"
# and "succeeded" (a review).
NOT_FOUND = "No part of the context answers the question."
# ... and when no sub-query answered at all (a budget stop, say): not the same thing.
NO_ANSWER = "No answer: no sub-query answered"
DEFAULT_CHUNK = 50_000
DEFAULT_FANOUT = 64

MAP_HEADER = (
    "Answer the question using only the excerpt below. Reply NONE if the excerpt does not "
    "help.\n\nQUESTION: {question}\n\nEXCERPT:\n"
)
COMBINE_HEADER = (
    "Combine these partial answers into one answer to the question.\n\n"
    "QUESTION: {question}\n\nPARTIAL ANSWERS:\n"
)
SCORE_HEADER = (
    "Score from 0 to 10 how likely the excerpt below holds the answer to the question. "
    "Reply with the number only.\n\nQUESTION: {question}\n\nEXCERPT:\n"
)
REFINE_HEADER = (
    "Improve the draft answer to the question using only the excerpt below. Reply SAME if "
    "the excerpt does not change it.\n\nQUESTION: {question}\n\nDRAFT ANSWER: {draft}\n\n"
    "EXCERPT:\n"
)


@dataclass
class Functions:
    """The REPL functions the patterns are built on, and the context."""

    llm_query: Callable[..., Any]
    llm_query_batched: Callable[..., Any]
    rlm_query: Callable[..., Any]
    context: Any


def _nothing(answer: Any) -> bool:
    """Whether map_reduce found nothing to answer with."""
    return answer is None or answer == NOT_FOUND or str(answer).startswith(NO_ANSWER)


def useful(replies: Sequence[Any]) -> list[str]:
    """Replies that are answers: not failures, not NONE, not empty."""
    kept = []
    for reply in replies:
        text = str(reply).strip()
        if text and not text.startswith(FAILED) and text.rstrip(".").upper() != NONE:
            kept.append(text)
    return kept


def bind(fn: Functions) -> dict[str, Callable[..., Any]]:
    """The patterns as REPL functions over ``fn``. Each also takes ``tier=`` (for example
    "redundant"), the verification tier of every sub-query it sends."""
    plain = _bind(fn)

    def tiered(name: str) -> Callable[..., Any]:
        def call(*args: Any, tier: str | None = None, **kwargs: Any) -> Any:
            if tier is None:
                return plain[name](*args, **kwargs)
            checked = Functions(
                functools.partial(fn.llm_query, tier=tier),
                functools.partial(fn.llm_query_batched, tier=tier),
                fn.rlm_query,
                fn.context,
            )
            return _bind(checked)[name](*args, **kwargs)

        functools.update_wrapper(call, plain[name])
        return call

    return {name: tiered(name) for name in plain}


def _bind(fn: Functions) -> dict[str, Callable[..., Any]]:

    def fragments_of(source: Any, chunk_size: int, overlap: int) -> list[Any]:
        if source is None:
            source = fn.context
        if hasattr(source, "chunks"):
            return source.chunks(chunk_size, overlap)
        if isinstance(source, str):
            step = max(1, chunk_size - overlap)
            return [source[at : at + chunk_size] for at in range(0, max(1, len(source)), step)]
        return list(source)

    def combine(question: str, answers: list[str]) -> str:
        bullets = "\n".join("- " + " ".join(a.split()) for a in answers)
        merged = str(fn.llm_query(COMBINE_HEADER.format(question=question) + bullets))
        return answers[0] if merged.startswith(FAILED) else merged

    def map_reduce(
        question: str,
        fragments: Any = None,
        *,
        chunk_size: int = DEFAULT_CHUNK,
        overlap: int = 200,
        header: str | None = None,
        reduce: Callable[[list[str]], Any] | None = None,
    ) -> Any:
        """Ask one sub-query per fragment (all in one batch), then reduce the useful
        replies: with ``reduce`` (plain Python over the list) or one combining sub-query;
        with none useful, NOT_FOUND (NO_ANSWER, with the first failure, when every reply
        failed). ``fragments`` defaults to the context cut into ``chunk_size`` characters."""
        parts = fragments_of(fragments, chunk_size, overlap)
        head = (header or MAP_HEADER).format(question=question)
        replies = fn.llm_query_batched([head + part for part in parts]) if parts else []
        found = useful(replies)
        if reduce is not None:
            return reduce(found)
        if not found:
            failed = [str(r) for r in replies if str(r).startswith(FAILED)]
            if not failed:
                return NOT_FOUND
            return f"{NO_ANSWER} ({len(failed)} of {len(replies)} failed; first: {failed[0][:300]})"
        if len(set(found)) == 1:
            return found[0]
        return combine(question, found)

    def decompose(
        question: str,
        source: Any = None,
        *,
        depth: int = 2,
        split: int = 4,
        leaf_chars: int = DEFAULT_CHUNK,
        use_rlm: bool = False,
    ) -> Any:
        """Recursive decomposition: a part too big for one sub-query is split in ``split``,
        down to ``depth`` levels; the leaves are asked in one batch, then each level's
        answers are combined per parent, again one batch per level. With ``use_rlm`` the
        parts of the first split go to child RLMs (rlm_query), whose depth the conductor
        bounds by policy.max_depth."""
        if depth < 0 or split < 2:
            raise ValueError("decompose: depth must be >= 0 and split >= 2")
        root = fn.context if source is None else source
        if use_rlm:
            parts = _split(root, split)
            answers = useful([fn.rlm_query(question, context=part) for part in parts])
            return combine(question, answers) if len(answers) > 1 else (answers or [None])[0]
        # Build the tree level by level: (node, parent index) with node a Fragment or str.
        levels: list[list[tuple[Any, int]]] = [[(root, -1)]]
        leaves: list[tuple[int, int]] = []  # (level, index) of nodes asked directly
        for level in range(depth + 1):
            following: list[tuple[Any, int]] = []
            for index, (node, _parent) in enumerate(levels[level]):
                if len(node) <= leaf_chars or level == depth:
                    leaves.append((level, index))
                else:
                    following.extend((part, index) for part in _split(node, split))
            if not following:
                break
            levels.append(following)
        head = MAP_HEADER.format(question=question)
        nodes = [levels[lv][ix][0] for lv, ix in leaves]
        replies = fn.llm_query_batched([head + _ref(node) for node in nodes])
        answer: dict[tuple[int, int], list[str]] = {}
        for key, reply in zip(leaves, replies, strict=True):
            answer[key] = useful([reply])
        # Upwards: a parent's answer combines its children's, one batch per level.
        for level in range(len(levels) - 1, 0, -1):
            gathered: dict[int, list[str]] = {}
            for index, (_node, parent) in enumerate(levels[level]):
                gathered.setdefault(parent, []).extend(answer.get((level, index), []))
            asks = [(p, found) for p, found in gathered.items() if len(set(found)) > 1]
            for parent, found in gathered.items():
                answer[(level - 1, parent)] = list(dict.fromkeys(found))[:1]
            if asks:
                prompts = [
                    COMBINE_HEADER.format(question=question)
                    + "\n".join("- " + " ".join(f.split()) for f in found)
                    for _p, found in asks
                ]
                for (parent, _found), merged in zip(
                    asks, fn.llm_query_batched(prompts), strict=True
                ):
                    answer[(level - 1, parent)] = useful([merged]) or _found[:1]
        result = answer.get((0, 0), [])
        return result[0] if result else None

    def refine(
        question: str,
        fragments: Any = None,
        *,
        rounds: int = 3,
        chunk_size: int = DEFAULT_CHUNK,
        accept: Callable[[str], bool] | None = None,
        draft: str | None = None,
    ) -> Any:
        """Iterative refinement: a first draft by map_reduce (unless given), then rounds in
        which every fragment is asked, in one batch, to improve the draft; it stops early
        when no fragment changes it or ``accept(draft)`` is true."""
        parts = fragments_of(fragments, chunk_size, 0)
        current = draft if draft is not None else map_reduce(question, parts)
        for _round in range(rounds):
            if _nothing(current) or (accept is not None and accept(str(current))):
                break  # nothing to improve (a review: NOT_FOUND was "improved" into a guess)
            head = REFINE_HEADER.format(question=question, draft=" ".join(str(current).split()))
            changes = [
                r for r in useful(fn.llm_query_batched([head + p for p in parts]))
                if r.rstrip(".").upper() != "SAME" and r != current
            ]  # fmt: skip
            if not changes:
                break
            current = changes[0] if len(set(changes)) == 1 else combine(question, changes)
        return current

    def tree_search(
        question: str,
        source: Any = None,
        *,
        beam: int = 3,
        branch: int = 8,
        leaf_chars: int = 20_000,
        max_levels: int = 6,
        score: Callable[[Any], float] | None = None,
    ) -> Any:
        """Tree search over the context: split each kept node in ``branch`` parts, score
        every part (one batch of scoring sub-queries per level, or ``score`` in plain
        Python), keep the ``beam`` best and prune the rest, until the parts are leaves of
        at most ``leaf_chars``; then the best leaves are asked the question, in one batch."""
        frontier = [fn.context if source is None else source]
        for _level in range(max_levels):
            if all(len(node) <= leaf_chars for node in frontier):
                break
            children = [
                part for node in frontier
                for part in (_split(node, branch) if len(node) > leaf_chars else [node])
            ]  # fmt: skip
            if score is not None:
                scores = [float(score(part)) for part in children]
            else:
                head = SCORE_HEADER.format(question=question)
                replies = fn.llm_query_batched([head + _ref(part) for part in children])
                scores = [_number(reply) for reply in replies]
            for part, value in zip(children, scores, strict=True):
                if hasattr(part, "score"):
                    part.score = value
            ranked = sorted(zip(scores, range(len(children)), strict=True), reverse=True)
            frontier = [children[i] for _s, i in ranked[:beam]]
        head = MAP_HEADER.format(question=question)
        replies = fn.llm_query_batched([head + _ref(leaf) for leaf in frontier])
        found = useful(replies)
        return found[0] if found else None

    return {
        "map_reduce": map_reduce,
        "decompose": decompose,
        "refine": refine,
        "tree_search": tree_search,
    }


def _split(node: Any, parts: int) -> list[Any]:
    """A Fragment or the context cut in ``parts`` consecutive Fragments; a str in substrings."""
    size = max(1, -(-len(node) // parts))
    if hasattr(node, "chunks"):  # the context itself
        return node.chunks(size)
    if hasattr(node, "byte_start"):  # a Fragment: cut it through the context it came from
        source = node._source
        return [
            source.fragment(at, min(node.end, at + size))
            for at in range(node.start, node.end, size)
        ]
    return [node[at : at + size] for at in range(0, len(node), size)]


def _ref(node: Any) -> Any:
    """What goes into a prompt for a node: the context itself travels as one Fragment (a
    reference), never pasted whole; Fragments and strings as they are."""
    if hasattr(node, "chunks"):
        return node.fragment(0, len(node))
    return node


def _number(reply: Any) -> float:
    match = re.search(r"-?\d+(?:\.\d+)?", str(reply))
    return float(match.group()) if match and not str(reply).startswith(FAILED) else 0.0
