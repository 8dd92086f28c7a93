from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand
from traces import store

FORMATS = ("otlp", "parquet", "jsonl")


class Command(FrlmCommand):
    help = (
        "Export a run's stored trace: OTLP/JSON (for OpenTelemetry tools), Parquet (the "
        "store's own schema) or JSON lines (one event a line); or push it to an "
        "OpenTelemetry collector over OTLP/HTTP (--otlp-endpoint)."
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
        parser.add_argument(
            "--otlp-endpoint",
            "--endpoint",
            dest="otlp_endpoint",
            default=None,
            metavar="URL",
            help="push the trace to this OTLP/HTTP collector (protobuf) instead of printing "
            "it, e.g. http://localhost:6006 for Phoenix or "
            "https://cloud.langfuse.com/api/public/otel; /v1/traces is added unless given",
        )
        parser.add_argument(
            "--otlp-header",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a header for the collector (repeatable), e.g. Authorization=Basic ...; "
            "also read from OTEL_EXPORTER_OTLP_HEADERS (k1=v1,k2=v2)",
        )

    def handle(self, *args: Any, run_id: str, **o: Any) -> None:
        """1. check the options, 2. read the run's stored events, 3. write them out."""
        # Imported here, not with the module (Arrow and the OTLP schema): `--help` is at once.
        from traces.blobs import blob_get
        from traces.interchange import to_jsonl, write_parquet
        from traces.otlp import to_otlp

        fmt, output = o["format"], o["output"]
        if fmt == "parquet" and not output:
            raise CommandError("--format parquet writes a binary file: give --output PATH")
        if o["otlp_endpoint"]:
            self.push(run_id, o)
            return
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

    def push(self, run_id: str, o: dict[str, Any]) -> None:
        """1. check the headers, 2. read and export the run, 3. POST it, 4. say what the
        collector kept."""
        from traces.blobs import blob_get
        from traces.otlp import to_otlp
        from traces.otlp_push import HEADERS_ENV, PushError, parse_headers, push

        if o["format"] != "otlp" or o["output"]:
            raise CommandError("--otlp-endpoint pushes OTLP: leave out --format and --output")
        try:
            headers = parse_headers(o["otlp_header"], os.environ.get(HEADERS_ENV))
        except PushError as exc:
            raise CommandError(str(exc)) from exc
        events = self.events(run_id)
        payloads = None if o["no_payloads"] else blob_get
        document = to_otlp(run_id, events, payload_text=payloads)
        spans = len(document["resourceSpans"][0]["scopeSpans"][0]["spans"])
        try:
            rejected = push(document, o["otlp_endpoint"], headers=headers)
        except PushError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"pushed {spans} spans of run {run_id} to {o['otlp_endpoint']}"
            + (f"; the collector rejected {rejected}" if rejected else "")
        )
        if rejected:
            raise CommandError(f"the collector rejected {rejected} of {spans} spans")

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
