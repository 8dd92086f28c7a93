"""Steps the page tests share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client

from tests.helpers import scripted, wait_until

SHOTS = Path(os.environ.get("FRLM_SHOTS_DIR", "/tmp/frlm-shots"))
PASSWORD = "correct horse battery staple"

# A run that stays live for several seconds: an open REPL cell, a fanout batch whose
# workers take a while, then the answer.
SLOW_CELLS = (
    "import time\nfor i in range(5):\n    time.sleep(0.4)\n    print('tick', i)",
    "rs = llm_query_batched(['part %d of the plan' % i for i in range(24)])\n"
    "print(len(rs), 'replies')",
    "time.sleep(1.0)\nFINAL('the plan holds')",
)
SLOW_WORKERS = {"latency_ms": 350}


def slow_question(ticks: int = 5, tail_s: float = 1.0) -> str:
    """SLOW_CELLS, with a first cell of `ticks` 0.4-second sleeps and a last one that
    sleeps `tail_s` before the answer."""
    first = SLOW_CELLS[0].replace("range(5)", f"range({ticks})")
    last = SLOW_CELLS[2].replace("time.sleep(1.0)", f"time.sleep({tail_s})")
    return scripted(first, SLOW_CELLS[1], last)


def plot_updates(page: Any) -> dict[str, int]:
    """How many times each of the five views has been drawn."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('[data-view]')]
              .map(d => [d.dataset.view, Number(d.dataset.updates || 0)]))"""
    )


def wait_for(page: Any, expression: str, timeout: float = 30.0, what: str = "") -> Any:
    """Poll a JavaScript expression in the page until it is truthy."""
    return wait_until(
        lambda: page.evaluate(expression), timeout=timeout, every=0.1, what=what or expression
    )


# A valid launcher form over a small generated task, as the browser posts it.
TASK_FORM = {
    "question": "q",
    "context_source": "task",
    "task_name": "sniah",
    "task_tokens": "20000",
    "task_seed": "1",
    "root_kind": "sim",
    "worker_kind": "sim",
    "venues": ["local"],
}


def launcher_form(**fields: object) -> dict[str, object]:
    """TASK_FORM with `fields` changed or added."""
    return {**TASK_FORM, **fields}


def make_user(username: str, *, staff: bool = False):
    user = get_user_model().objects.create_user(username, password=PASSWORD, is_staff=staff)
    return user


def session_cookie(user, web: str) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {
        "name": "sessionid",
        "value": client.cookies["sessionid"].value,
        "url": web,
    }


def shot(page, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
