"""What the root model is told: the REPL, its functions, the context's size and the limits."""

from __future__ import annotations

from runs.policy import Policy

SYSTEM = """You answer a question about a context that is far too large to read at once.
You work in a Python REPL where the context is already loaded in the variable `context` (a str).
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
