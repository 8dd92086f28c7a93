from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand
from traces import store
from traces.blobs import blob_get
from traces.interchange import to_jsonl, write_parquet
from traces.otlp import to_otlp

FORMATS = ("otlp", "parquet", "jsonl")


class Command(FrlmCommand):
    help = (
        "Export a run's stored trace: OTLP/JSON (for OpenTelemetry tools), Parquet (the "
        "store's own schema) or JSON lines (one event a line)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", help="the run whose trace to export (see frlm_runs)")
        parser.add_argument(
            "--format", choices=FORMATS, default="otlp", help="what to write (default otlp)"
        )
        parser.add_argument(
            "--output", default=None, help="file to write (stdout when left out, not parquet)"
        )
        parser.add_argument(
            "--no-payloads",
            action="store_true",
            help="otlp: keep prompts and replies out, by reference only",
        )

    def handle(self, *args: Any, run_id: str, **o: Any) -> None:
        """1. check the options, 2. read the run's stored events, 3. write them out."""
        fmt, output = o["format"], o["output"]
        if fmt == "parquet" and not output:
            raise CommandError("--format parquet writes a binary file: give --output PATH")
        events = self.events(run_id)
        if fmt == "parquet":
            self.write(Path(output), lambda tmp: write_parquet(run_id, events, tmp))
            return
        if fmt == "otlp":
            payloads = None if o["no_payloads"] else blob_get
            text = json.dumps(to_otlp(run_id, events, payload_text=payloads)) + "\n"
        else:
            text = to_jsonl(run_id, events)
        if output:
            self.write(Path(output), lambda tmp: tmp.write_text(text, encoding="utf-8"))
        else:
            self.stdout.write(text, ending="")

    def events(self, run_id: str) -> list[dict[str, Any]]:
        try:
            events = store.read_events(run_id)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not events:
            raise CommandError(
                f"no trace stored for run {run_id!r}; check the id with "
                "`python manage.py frlm_runs`"
            )
        return events

    def write(self, path: Path, fill: Any) -> None:
        """Write beside the target and rename, so a reader never sees half a file."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fill(tmp)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise CommandError(f"cannot write {path}: {exc.strerror}") from exc
