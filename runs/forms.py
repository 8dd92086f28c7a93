"""The run launcher's form and the what-if replay form. Forms parse what the browser sent;
every rule about what makes a run valid lives in runs.services and runs.engine.policy, and their
errors are put back beside the fields they concern."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.conf import settings

from runs.engine.context import binary_head, context_roots
from runs.engine.policy import RANGES, Policy, PolicyError
from runs.program_templates import PROGRAM_TEMPLATES
from runs.services import ContextSpec, RunInputError
from runs.taskgen import (
    DEFAULT_SEED,
    DEFAULT_TOKENS,
    MAX_SEED,
    MAX_TOKENS,
    MIN_TOKENS,
    TASKS,
    task_problems,
)
from workers.backends import ModelSpec, model_spec
from workers.models import Venue

UPLOAD_MAX_BYTES = 64 * 1024 * 1024

# The policy settings the launcher offers, with their labels (the rest keep defaults).
POLICY_FIELDS: dict[str, str] = {
    "max_batch": "Fanout width (max_batch)",
    "quorum": "Quorum fraction",
    "subquery_timeout_s": "Sub-query timeout (s)",
    "max_depth": "Max depth",
    "max_turns": "Max turns",
    "routing": "Routing",
    "tier": "Verification",
    "hedge": "Hedge stragglers",
    "budget_usd": "Budget (USD)",
}
_POLICY_PROBLEM = re.compile(r"^policy\.(\w+) ")


def _policy_field(name: str, label: str) -> forms.Field:
    """Typed, and with the policy's range as a browser hint; the range itself is checked
    by Policy, so there is one place that knows it."""
    low, high = RANGES[name]
    default = getattr(Policy(), name)
    kind = forms.IntegerField if isinstance(default, int) else forms.FloatField
    step = "1" if kind is forms.IntegerField else "any"
    return kind(
        label=label,
        initial=default,
        required=False,
        widget=forms.NumberInput(attrs={"min": low, "max": high, "step": step}),
        help_text=f"{low:g} to {high:g}, default {default:g}",
    )


def place_policy_errors(form: forms.Form, message: str) -> None:
    """Each of PolicyError's problems beside the setting it names."""
    for problem in message.split("; "):
        match = _POLICY_PROBLEM.match(problem)
        name = match.group(1) if match else None
        form.add_error(name if name in form.fields else None, problem)


def place_errors(form: forms.Form, error: RunInputError) -> None:
    """Put each service error beside its field: a policy message names its setting, a
    task's its number of tokens or its seed."""
    targets = {
        "question": "question",
        "venues": "venues",
        "from_turn": "from_turn",
        "program": "program",
    }
    for key, message in error.errors.items():
        if key == "policy":
            place_policy_errors(form, message)
        elif key == "context":
            form.add_error(form.context_field(), message)  # type: ignore[attr-defined]
        elif key == "task":
            # Its tokens' and seed's problems beside them (runs.taskgen.make_task).
            for problem in message.split("; "):
                first = problem.split(" ", 1)[0]
                form.add_error(
                    {"tokens": "task_tokens", "seed": "task_seed"}.get(first, "task_name"), problem
                )
        else:
            field = targets.get(key)
            form.add_error(field if field in form.fields else None, message)


class RunForm(forms.Form):
    question = forms.CharField(
        required=False,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "What do you want to know?"}),
        help_text="For a generated task, leave it empty to ask the task's own question.",
    )
    context_source = forms.ChoiceField(
        choices=[
            ("task", "Generated task"),
            ("upload", "Upload a file"),
            ("path", "Path on the server"),
        ],
        initial="task",
        widget=forms.RadioSelect,
        label="Context",
    )
    context_file = forms.FileField(
        required=False,
        label="File",
        # The page checks the size before it sends anything (templates/runs/new.html): a
        # body over the web server's limit came back as a bare 413, the form lost (a review).
        widget=forms.ClearableFileInput(attrs={"data-max-bytes": UPLOAD_MAX_BYTES}),
        help_text=f"A UTF-8 text file of at most {UPLOAD_MAX_BYTES // 2**20} MB; put a bigger "
        "context on the server and give its path.",
    )
    context_path = forms.CharField(
        required=False,
        label="Path",
        widget=forms.TextInput(attrs={"placeholder": "/data/corpus or /data/notes.txt"}),
        help_text="A text file or a folder of text files on this server, under a folder "
        "FRLM_CONTEXT_ROOTS allows (staff only).",
    )
    task_name = forms.ChoiceField(
        choices=[(name, name) for name in sorted(TASKS)], initial="sniah", label="Task"
    )
    # Their ranges are the task generator's (runs.taskgen.make_task), said with the run's
    # other problems: a range checked here held those back until it was met (a review).
    task_tokens = forms.IntegerField(
        initial=DEFAULT_TOKENS,
        label="Tokens",
        # A step from MIN_TOKENS that the default is on: with step 1000 from 100 the
        # browser held the default 100,000 invalid (a review).
        widget=forms.NumberInput(attrs={"step": MIN_TOKENS, "min": MIN_TOKENS, "max": MAX_TOKENS}),
        help_text=f"{MIN_TOKENS:,} to {MAX_TOKENS:,}",
    )
    task_seed = forms.IntegerField(
        initial=DEFAULT_SEED,
        label="Seed",
        widget=forms.NumberInput(attrs={"min": 0, "max": MAX_SEED}),
    )

    program = forms.ChoiceField(
        required=False,
        choices=[("", "None: the root model writes its own program")]
        + [(name, t["label"]) for name, t in PROGRAM_TEMPLATES.items()],
        label="Program template",
        help_text="Start from a program pattern: the root model is asked to run it on your "
        "question (its code is shown below).",
    )

    root_kind = forms.ChoiceField(
        choices=[("sim", "Simulated model"), ("openai", "OpenAI-compatible endpoint")],
        initial="sim",
        label="Root model",
    )
    root_endpoint = forms.ChoiceField(required=False, label="Endpoint")
    root_model = forms.CharField(required=False, label="Model")
    worker_kind = forms.ChoiceField(
        choices=[("sim", "Simulated model"), ("openai", "OpenAI-compatible endpoint")],
        initial="sim",
        label="Worker model",
    )
    worker_endpoint = forms.ChoiceField(required=False, label="Endpoint")
    worker_model = forms.CharField(required=False, label="Model")

    venues = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Venues"
    )

    max_batch = _policy_field("max_batch", POLICY_FIELDS["max_batch"])
    quorum = _policy_field("quorum", POLICY_FIELDS["quorum"])
    subquery_timeout_s = _policy_field("subquery_timeout_s", POLICY_FIELDS["subquery_timeout_s"])
    max_depth = _policy_field("max_depth", POLICY_FIELDS["max_depth"])
    max_turns = _policy_field("max_turns", POLICY_FIELDS["max_turns"])
    routing = forms.ChoiceField(
        label=POLICY_FIELDS["routing"],
        required=False,
        initial="score",
        choices=[
            ("score", "Scheduler: reputation, latency, load, price"),
            ("shared", "Shared venue queue (any free worker)"),
            ("round_robin", "Round robin over workers"),
        ],
        help_text="Where each sub-query runs; the trace records every choice.",
    )
    tier = forms.ChoiceField(
        label=POLICY_FIELDS["tier"],
        required=False,
        initial="best_effort",
        choices=[
            ("best_effort", "Best effort: take each reply"),
            ("redundant", "Redundant: distinct workers must agree"),
            ("high_trust", "High trust: a trusted validator re-runs a sample and signs"),
        ],
        help_text="How replies from workers nobody vouches for are checked.",
    )
    hedge = forms.ChoiceField(
        label=POLICY_FIELDS["hedge"],
        required=False,
        initial="p95",
        choices=[(q, f"past the venue's {q} latency") for q in ("p90", "p95", "p99")]
        + [("off", "never")],
        help_text="A straggling sub-query gets a twin on another worker; the first wins.",
    )
    budget_usd = _policy_field("budget_usd", POLICY_FIELDS["budget_usd"])
    budget_usd.help_text = "Dollars for the whole run, root turns included; 0: no cap."

    def __init__(self, *args: Any, user: Any = None, live: set[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.user = user
        live = live or set()
        names = list(Venue.objects.values_list("name", flat=True))
        self.fields["venues"].choices = [
            (name, f"{name} ({'online' if name in live else 'no live worker'})") for name in names
        ]
        self.fields["venues"].initial = [n for n in names if n in live] or names[:1]
        # Configured endpoints only (settings.FRLM_ENDPOINTS), never a URL typed here.
        endpoints = [(name, f"{name} ({url})") for name, url in settings.FRLM_ENDPOINTS.items()]
        for role in ("root", "worker"):
            self.fields[f"{role}_endpoint"].choices = endpoints
        if user is not None and not user.is_staff:
            # Offered to a user it always refused (a review); a post naming it is still
            # refused with the reason (clean).
            source = self.fields["context_source"]
            source.widget.choices = [c for c in source.choices if c[0] != "path"]
        if user is not None and user.is_staff:
            roots = context_roots()
            allowed = ", ".join(map(str, roots)) or "none"
            self.fields["context_path"].help_text += f" Here: {allowed}."
            if roots:
                placeholder = f"{roots[0]}/notes.txt"
                self.fields["context_path"].widget.attrs["placeholder"] = placeholder

    def context_field(self) -> str:
        source = self.cleaned_data.get("context_source") if hasattr(self, "cleaned_data") else None
        return {"upload": "context_file", "path": "context_path"}.get(source or "", "task_name")

    def clean_context_file(self) -> Any:
        upload = self.cleaned_data.get("context_file")
        if self.cleaned_data.get("context_source") != "upload":
            return None  # a file chosen, then another context picked: not read
        if upload is not None and upload.size > UPLOAD_MAX_BYTES:
            raise forms.ValidationError(
                f"the file is {upload.size:,} bytes; upload at most {UPLOAD_MAX_BYTES:,}, or "
                "put bigger contexts on the server and give their path"
            )
        return upload

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        source = data.get("context_source")
        if (
            source == "upload"
            and not data.get("context_file")
            and "context_file" not in self.errors
        ):
            self.add_error("context_file", "choose a text file to upload")
        if source == "path" and self.user is not None and not self.user.is_staff:
            # On the choice itself: the path's field is not shown to whom it is not offered.
            self.add_error(
                "context_source", "only staff may read files on the server; upload the file"
            )
        for role in ("root", "worker"):
            if data.get(f"{role}_kind") != "openai":
                continue
            if not settings.FRLM_ENDPOINTS:
                self.add_error(
                    f"{role}_kind", "no endpoint is configured on this server (FRLM_ENDPOINTS)"
                )
            elif not data.get(f"{role}_endpoint") and f"{role}_endpoint" not in self.errors:
                self.add_error(f"{role}_endpoint", "choose one of the configured endpoints")
            if not data.get(f"{role}_model"):
                self.add_error(f"{role}_model", "name the model the endpoint serves")
        return data

    # --- what the service takes ---
    def context_spec(self) -> ContextSpec:
        data = self.cleaned_data
        source = data["context_source"]
        if source == "task":
            return ContextSpec(
                task=data["task_name"], tokens=data["task_tokens"], seed=data["task_seed"]
            )
        if source == "path":
            return ContextSpec(path=data.get("context_path") or "")
        raw = data["context_file"].read()
        if binary_head(raw):  # what the conductor would refuse as binary
            # Taken, it failed the run at its start, naming the server's copy (a review).
            raise RunInputError(
                {
                    "context": "the file holds NUL bytes, so it is binary, not text; upload a "
                    "text file"
                }
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RunInputError(
                {"context": "the file is not UTF-8 text; upload a text file"}
            ) from exc
        return ContextSpec(text=text)

    def model(self, role: str) -> ModelSpec:
        data = self.cleaned_data
        if data[f"{role}_kind"] == "sim":
            return model_spec("sim", role=role)
        return model_spec(
            "openai",
            role=role,
            base_url=settings.FRLM_ENDPOINTS[data[f"{role}_endpoint"]],
            model=data.get(f"{role}_model"),
        )

    def policy(self) -> dict[str, Any]:
        return {
            name: self.cleaned_data[name]
            for name in POLICY_FIELDS
            if self.cleaned_data.get(name) not in (None, "")
        }

    def check_task(self) -> None:
        """A generated task's size and seed beside their fields, for a form refused before
        the service could say them: an out-of-range token count waited for the policy's
        errors to be fixed first (a review)."""
        data = self.cleaned_data
        if data.get("context_source") != "task":
            return
        # Each on its own: a seed left blank held back the tokens' range (a review).
        problems = task_problems(data.get("task_tokens"), data.get("task_seed"))
        if problems:
            place_errors(self, RunInputError({"task": "; ".join(problems)}))

    def check_policy(self) -> None:
        """The policy's problems beside their settings, for a form refused before the
        service could say them (runs.views.run_new): not a submission later."""
        try:
            Policy.from_dict(self.policy())
        except PolicyError as exc:
            place_policy_errors(self, str(exc))


class ReplayForm(forms.Form):
    """Re-execute a finished run from its recording; from a root turn on, live and with
    changed policy (a what-if)."""

    from_turn = forms.IntegerField(
        required=False,
        min_value=0,
        # Turns 1..K come from the recording and the run is live after them: "Live from
        # root turn" with K in it said the opposite (a review).
        label="Recorded root turns, then live",
        help_text="Empty: replay the recording exactly, no model calls.",
    )
    quorum = forms.FloatField(required=False, label="Quorum")
    max_batch = forms.IntegerField(required=False, label="Fanout width")
    subquery_timeout_s = forms.FloatField(required=False, label="Sub-query timeout (s)")

    def policy_changes(self) -> dict[str, Any]:
        return {
            key: self.cleaned_data[key]
            for key in ("quorum", "max_batch", "subquery_timeout_s")
            if self.cleaned_data.get(key) is not None
        }
