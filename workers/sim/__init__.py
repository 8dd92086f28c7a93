"""FRLM's simulated model: a deterministic stand-in for a language model, served over the
OpenAI-compatible HTTP API so the real client code path runs without any model weights.

It is not a real LLM and says so wherever it shows up (model ids, `owned_by`,
`system_fingerprint`, the `X-FRLM-Simulated` response header).

- `workers.sim.server.make_server` serves it (and `manage.py frlm_simserver` runs that);
- `workers.sim.root` is the root model: it writes Python programs for the REPL
  (`conversation` reads what it is sent, `strategies` picks and fills a program from the
  texts in `programs`);
- `workers.sim.reader` is the worker model: it answers by reading the fragment it is sent;
- `workers.sim.profile` decides each request's latency, straggling, failure and lying;
- `workers.sim.device` gives a worker's simulated model the profile of the device that
  worker plays (`frlm_worker --sim-...`).

This module holds only the vocabulary those share, so importing it pulls in nothing else.
"""

from __future__ import annotations

from typing import TypedDict

ROOT_MODEL = "frlm-sim-root"
WORKER_MODEL = "frlm-sim-worker"
OWNER = "frlm-simulated"
LABEL = "FRLM simulated model, not a real LLM"


class ChatMessage(TypedDict):
    """One chat message with its content already flattened to text."""

    role: str
    content: str
