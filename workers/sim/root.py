"""The simulated ROOT model (`frlm-sim-root`): it reads the conversation the conductor
writes and replies with prose and one ```repl block of real Python, as an RLM root does.

Behaviours, chosen from the question:
- scripted: the question carries ```repl blocks; turn k replies with block k;
- needle, records and generic: a program chosen and filled in by workers.sim.strategies
  from the texts in workers.sim.programs; later turns finish, retry once with a smaller
  program when the first one raised, or give the best answer the outputs hold.

What it understands of the conversation is in workers.sim.conversation; this module
decides each turn's reply.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workers.sim import ChatMessage
from workers.sim.conversation import (
    Conversation,
    Summary,
    best_guess,
    error_line,
    last_line,
    parse_conversation,
    parse_summary,
    scripted_blocks,
)
from workers.sim.programs import RETRY_MARK
from workers.sim.strategies import Strategy, strategy_for


def root_reply(messages: Sequence[ChatMessage]) -> str:
    """The root model's next reply."""
    conversation = parse_conversation(messages)
    blocks = scripted_blocks(conversation.question)
    if blocks:
        return _scripted_reply(conversation, blocks)
    strategy = strategy_for(conversation)
    if conversation.asks_for_final:
        return final_line(best_guess(conversation.outputs, strategy.empty_answer))
    if conversation.turn == 1:
        return code_reply(*strategy.first)
    return _follow_up(conversation, strategy)


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
