"""The REPL sandbox of the RLM runtime: root-model code runs here, isolated from the host."""

from __future__ import annotations

from runs.sandbox.cells import CellResult, SandboxLimits
from runs.sandbox.host import UNISOLATED, CellStopped, Sandbox, SandboxError, isolation_problem
from runs.sandbox.protocol import Handler, SandboxCallError

__all__ = [
    "CellResult",
    "CellStopped",
    "Handler",
    "Sandbox",
    "SandboxCallError",
    "SandboxError",
    "SandboxLimits",
    "UNISOLATED",
    "isolation_problem",
]
