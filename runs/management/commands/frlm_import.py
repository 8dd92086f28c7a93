from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, number


class Command(FrlmCommand):
    help = (
        "Import a trace as a new run: an OTLP/JSON trace (as frlm_export writes) or a "
        "trajectory log of the rlms library (JSON lines). Prints the new run id."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "file", help="an OTLP/JSON trace (frlm_export's) or an rlms trajectory log (.jsonl)"
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.add_argument(
            "--wait", type=number(0), default=30.0, help="seconds to wait for the recorder"
        )

    def handle(self, *args: Any, file: str, **o: Any) -> None:
        # Imported here, not with the module: `--help` and a bad flag answer at once.
        import redis

        from frlm_web.redis_client import redis_available
        from runs.importing import run_import
        from traces.interchange import InterchangeError

        """1. check the file and Redis, 2. import (parse all, save, send, wait),
        3. report; exit 1 when the recorder did not store the events."""
        path = Path(file)
        if path.is_dir():
            raise CommandError(
                f"{file} is a folder: give one trace file (an OTLP/JSON export, JSON lines, or "
                "an rlms log)"
            )
        if not path.is_file():
            raise CommandError(f"no such file: {file}")
        if not redis_available():
            raise CommandError("Redis is not reachable at FRLM_REDIS_URL; start it with `make up`")
        try:
            outcome = run_import(path, wait_s=o["wait"])
        except InterchangeError as exc:
            raise CommandError(f"cannot import {file}: {exc}") from exc
        except redis.RedisError as exc:
            raise CommandError(f"cannot import {file}: Redis refused the events: {exc}") from exc
        summary = outcome.summary()
        if o["json"]:
            self.stdout.write(json.dumps(summary))
        else:
            self.stdout.write(summary["run_id"])
            self.stderr.write(
                f"imported {summary['spans']} spans ({summary['events']} events) from "
                f"{summary['format']} as run {summary['run_id']} ({summary['status']})"
            )
        if not outcome.stored:
            if not o["json"]:
                self.stderr.write(summary["error"] or "the events were not stored")
            sys.exit(1)
