"""The REPL sandbox of the RLM runtime: root-model code runs here, isolated from the host."""

from __future__ import annotations

from runs.sandbox.host import (
    CellResult,
    Handler,
    Sandbox,
    SandboxCallError,
    SandboxError,
    SandboxLimits,
)

__all__ = [
    "CellResult",
    "Handler",
    "Sandbox",
    "SandboxCallError",
    "SandboxError",
    "SandboxLimits",
]
