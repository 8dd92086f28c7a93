"""What the root model is told: the REPL, its functions, the context's size and the limits."""

from __future__ import annotations

from runs.engine.policy import Policy

SYSTEM = """You answer a question about a context that is far too large to read at once.
You work in a Python REPL where the context is the variable `context`. It behaves like a str (len,
slices, `in`, find, count, iteration) but is read from disk piece by piece, so it can be far
larger than memory; str(context) or other str methods read it whole and fail on a big one.
Write Python in fenced blocks that open with ```repl and close with ```; each block runs in the
REPL, variables persist between blocks, and you see what the block printed.

Functions in the REPL:
- llm_query(prompt) -> str: ask a language model about a piece of the context (pass the piece
  in the prompt; it can read about {worker_window} characters).
- llm_query_batched(prompts) -> list[str]: ask many prompts at once; they run in parallel on
  worker machines, so prefer one batch to a loop of llm_query. Replies come back in the order of
  the prompts. A reply that failed, timed out or was cancelled starts with "[frlm:".
- rlm_query(prompt, context=None) -> str: hand a sub-problem to a child like you with its own
  REPL over `context` (default: yours).
- FINAL(answer): give your final answer. FINAL_VAR(name): give the variable `name` as your answer.
- SHOW_VARS(): list your variables.

Reading the context without holding it: context.lines(); context.search(regex) yields matches
with offsets (the re module's functions need a real str: pass them context[a:b]);
context.chunks(size, overlap=0, by="chars"|"lines"|"tokens") -> list of Fragment;
context.fragment(a, b) -> Fragment. A Fragment is a reference (path, offsets, sha256): put it in
a prompt (`header + fragment`) and the worker reads just that piece; fragment.text() reads it
here. select_fragments(query, k) -> the k Fragments that best match `query` (BM25, each with a
.score). `folded` holds the full text of earlier turns that were folded to save space.

Program patterns (each fans out through llm_query_batched / rlm_query):
- map_reduce(question, fragments=None, chunk_size=50000, reduce=None): ask every fragment, then
  merge the useful replies (with `reduce(list_of_replies)` in Python, or one more sub-query).
- decompose(question, source=None, depth=2, split=4, leaf_chars=50000, use_rlm=False): split
  recursively down to `depth` levels, answer the leaves, combine upwards.
- refine(question, fragments=None, rounds=3, accept=None): a draft, then rounds of improvement
  against every fragment, stopping early when nothing changes or accept(draft) is true.
- tree_search(question, source=None, beam=3, branch=8, leaf_chars=20000, score=None): split,
  score the parts (by sub-queries or your `score` function), keep the best `beam`, go deeper.

Inspect the context (its length, a few slices, a regex search) before you decide how to split
it. Print only what you need: long output is cut.

Context: str of {chars} characters (about {tokens} tokens).
Limits: max_batch={max_batch}, max_subqueries={max_subqueries}, depth={depth}/{max_depth}.
"""

FINAL_NUDGE = (
    "You have used all your turns. Give your final answer now, as FINAL(answer) on its own "
    "line, using what the REPL has shown you."
)
NO_CODE_NUDGE = (
    "Your reply had no ```repl block and no FINAL(...). Write code in a ```repl block, or give "
    "FINAL(answer)."
)


def system_prompt(*, chars: int, policy: Policy, depth: int, worker_window: int = 32000) -> str:
    return SYSTEM.format(
        chars=chars,
        tokens=chars // 4,
        max_batch=policy.max_batch,
        max_subqueries=policy.max_subqueries,
        depth=depth,
        max_depth=policy.max_depth,
        worker_window=worker_window,
    )


def question_message(question: str) -> str:
    return f"Question: {question}"


def output_message(cell: int, text: str) -> str:
    return f"REPL output (cell {cell}):\n```\n{text}\n```"
