"""The apps import one way only: runs -> workers -> traces. runs may import workers and
traces, workers may import traces, traces imports neither. Every import counts, the ones
inside functions too (a deferred import is still a dependency, only a hidden one)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# For each app, the apps it must not import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "runs": (),
    "workers": ("runs",),
    "traces": ("runs", "workers"),
}


def module_name(path: Path) -> str:
    """`workers/sim/root.py` -> `workers.sim.root`; a package's __init__ is the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, at any depth: module level,
    inside functions and classes, and importlib.import_module("...") with a literal name."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield node.lineno, base
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def app_files(app: str) -> Iterator[Path]:
    for path in sorted((ROOT / app).rglob("*.py")):
        if "migrations" not in path.relative_to(ROOT).parts:
            yield path


def against_direction(app: str) -> list[str]:
    """`file:line imports name` for each import in `app` of an app it must not import."""
    banned = FORBIDDEN[app]
    found = []
    for path in app_files(app):
        module = module_name(path)
        source = path.read_text(encoding="utf-8")
        for line, name in imports(source, module, is_package=path.name == "__init__.py"):
            if name.split(".")[0] in banned:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_it_keeps_workers_from_importing_runs() -> None:
    offending = against_direction("workers")
    assert not offending, "workers must not import runs:\n" + "\n".join(offending)


def test_it_keeps_traces_from_importing_runs_or_workers() -> None:
    offending = against_direction("traces")
    assert not offending, "traces must not import runs or workers:\n" + "\n".join(offending)


def test_it_reads_every_app_file_but_migrations() -> None:
    files = [p.relative_to(ROOT).as_posix() for app in FORBIDDEN for p in app_files(app)]
    assert "workers/tasks.py" in files and "traces/views.py" in files
    assert "runs/trust/verify.py" in files
    assert not [f for f in files if "/migrations/" in f]


def test_it_sees_imports_at_any_depth_and_relative_ones() -> None:
    source = (
        "import runs.models\n"
        "from workers import keys\n"
        "def late():\n"
        "    from runs.trust.verify import agree\n"
        "class Lazy:\n"
        "    def method(self):\n"
        "        importlib.import_module('runs.selectors')\n"
        "from . import sibling\n"
        "from ..other import thing\n"
    )
    found = sorted(imports(source, "workers.sim.device"))
    assert found == [
        (1, "runs.models"),
        (2, "workers"),
        (4, "runs.trust.verify"),
        (7, "runs.selectors"),
        (8, "workers.sim"),
        (9, "workers.other"),
    ]
