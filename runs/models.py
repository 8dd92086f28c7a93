from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.db import models

from runs.program_templates import program_question
from workers.pricing import price_source


def lost_workers_in(accounts: object) -> list[dict[str, Any]]:
    """The workers lost while they held a run's work (runs/engine/fanout/liveness.py), as
    its conductor recorded them in `accounts`, each with the sentence that says it."""
    lost = accounts.get("lost") if isinstance(accounts, dict) else None
    if not isinstance(lost, list):
        return []
    return [{**w, "text": _lost_text(w)} for w in lost if isinstance(w, dict)]


def _lost_text(lost: dict[str, Any]) -> str:
    held = lost.get("held")
    held = held if isinstance(held, int) else 0
    return (
        f"worker {lost.get('worker_id')} of venue {lost.get('venue')} left while it held "
        f"{held} attempt{'s' if held != 1 else ''}; "
        f"{'each was' if held != 1 else 'it was'} tried again while tries and workers remained"
    )


def new_run_id() -> str:
    return "r" + secrets.token_hex(6)


class Run(models.Model):
    """One FRLM run: a question over a context, answered by a root model and its sub-queries.
    One run is one trace (its events carry the run id)."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        # Ended early at its budget cap: the answer rests on the sub-queries that were paid for.
        PARTIAL = "partial"

    class Source(models.TextChoices):
        TEXT = "text", "text"
        PATH = "path", "file or folder on the server"
        TASK = "task", "generated task"
        IMPORTED = "imported", "imported trace"

    id = models.CharField(primary_key=True, max_length=32, default=new_run_id, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    question = models.TextField()  # as the user asked it
    # A program template the root model is asked to run (runs/program_templates.py), kept
    # apart from the question: attached to it, it was shown on every page as the question,
    # and the question's length limit was checked before it was added (a review).
    program = models.CharField(max_length=32, blank=True, default="")
    context_source = models.CharField(max_length=8, choices=Source.choices)
    context_path = models.CharField(
        max_length=1024, help_text="file or folder the context is read from"
    )
    context_chars = models.BigIntegerField(default=0)
    task = models.JSONField(null=True, blank=True, help_text="generated task: name, tokens, seed")
    expected_answer = models.TextField(blank=True)
    policy = models.JSONField(default=dict)
    root_model = models.JSONField()
    worker_model = models.JSONField()
    venues = models.JSONField(default=list)

    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED)
    answer = models.TextField(blank=True)
    correct = models.BooleanField(null=True, blank=True)
    error = models.TextField(blank=True)
    isolation = models.CharField(max_length=200, blank=True)
    conductor = models.CharField(max_length=200, blank=True, help_text="the conductor running it")
    replay_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replays",
        help_text="the run this one re-executes from its cassette",
    )
    replay_turn = models.IntegerField(
        null=True, blank=True, help_text="root turns taken from the cassette; live after them"
    )

    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    turns = models.IntegerField(default=0)
    subqueries = models.IntegerField(default=0)
    subqueries_failed = models.IntegerField(default=0)
    # Cancelled once their batch's quorum was met (policy.quorum): by design, not failures.
    subqueries_cut = models.IntegerField(default=0)
    # Not answered when the run was cancelled (out, or waiting to be sent): not failures.
    subqueries_cancelled = models.IntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    # Exact dollars (frlm_web.money); 12 places reach a pico-dollar, finer than any price.
    cost = models.DecimalField(max_digits=20, decimal_places=12, default=0)
    wall_ms = models.FloatField(null=True, blank=True)
    # What trust and money figures the run ended with (RunAccounts): the verification share,
    # the budget against its caps, and the receipts' summary.
    accounts = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.id}: {self.question[:60]}"

    @property
    def unisolated(self) -> bool:
        """Its REPL ran without bubblewrap, because the operator set
        FRLM_SANDBOX_ISOLATION=none (runs.sandbox.host marks the isolation text so)."""
        return self.isolation.startswith("NOT ISOLATED")

    @property
    def price_sources(self) -> dict[str, str]:
        """Where its models' prices come from (workers.pricing): FRLM_PRICES, genai-prices,
        or FRLM's table and its date. A worker announcing its own price is paid at that."""
        recorded = (self.accounts or {}).get("prices")
        if isinstance(recorded, dict) and recorded:
            return recorded  # what the conductor priced at (runs/engine/finish.py)
        models = [m.get("model") for m in (self.root_model, self.worker_model)]
        return {m: price_source(m) for m in models if m}

    @property
    def exact_replay(self) -> bool:
        """A replay of all of another run from its recording: it called no model and spent
        nothing; its tokens and cost are the recording's."""
        return self.replay_of_id is not None and self.replay_turn is None

    @property
    def root_question(self) -> str:
        """What the root model is asked: the question, with its program template's program
        when it has one."""
        return program_question(self.program, self.question) if self.program else self.question

    @property
    def lost_workers(self) -> list[dict[str, Any]]:
        """The workers lost while they held its work (runs/engine/fanout/liveness.py), as
        its conductor recorded them when it ended."""
        return lost_workers_in(self.accounts)

    @property
    def done(self) -> bool:
        return self.status in {
            self.Status.SUCCEEDED,
            self.Status.FAILED,
            self.Status.CANCELLED,
            self.Status.PARTIAL,
        }


class Experiment(models.Model):
    """A suite run from the web console (runs.experiments): its definition, where its data
    and report go, and how far it got. Its runs are ordinary runs."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created = models.DateTimeField(auto_now_add=True)
    suite_name = models.CharField(max_length=64)
    suite = models.JSONField(default=dict, help_text="the suite as resolved (suite.json)")
    tune = models.JSONField(default=dict, blank=True, help_text="policy loop: key -> values")
    output_dir = models.CharField(max_length=1024)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    done = models.IntegerField(default=0)
    total = models.IntegerField(default=0)
    error = models.TextField(blank=True)
    report_path = models.CharField(max_length=1024, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"experiment {self.pk}: {self.suite_name} ({self.status})"

    @property
    def ended(self) -> bool:
        return self.status in {self.Status.DONE, self.Status.FAILED}
