"""Repository QA over a real source tree nobody wrote for this: the Python standard library
installed on the machine. A task's context is some of its modules, each under a header line
naming its file and module; its question has an exact answer computed from the code with
`ast`, never by hand:

- defines: which module defines the function or class X (X defined in exactly one of them);
- calls: how many functions in module M call Y (each function or method counted once when
  its own body, nested functions and classes left out, calls Y as `Y(...)` or `obj.Y(...)`);
- constant: the value of the module-level constant C in module M (assigned once, a literal).

The same (tokens, seed) picks the same modules and question on the same Python version.
"""

from __future__ import annotations

import ast
import functools
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from runs.taskgen.sniah import CHARS_PER_TOKEN

KINDS = ("defines", "calls", "constant")
# Folders of the standard library that are tests, tools or vendored copies, not its code.
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo"}
_MAX_FILE_CHARS = 400_000


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def header(rel: str) -> str:
    """The line that opens a module's source in the context."""
    return f"##### file: {rel} (module {module_name(rel)}) #####\n"


def module_name(rel: str) -> str:
    """`json/decoder.py` -> `json.decoder`; `json/__init__.py` -> `json`."""
    dotted = rel.removesuffix(".py").replace("/", ".")
    return dotted.removesuffix(".__init__")


@dataclass(frozen=True)
class Module:
    rel: str  # path under the standard library's folder
    chars: int  # of its header and source
    defined: frozenset[str]  # top-level functions and classes
    calls: tuple[tuple[str, int], ...]  # (called name, functions calling it), by name
    constants: tuple[tuple[str, str], ...]  # (NAME, value as text) of literal constants


@functools.cache
def source_files(root: str) -> tuple[tuple[str, int], ...]:
    """Every module file under `root` (tests, tools and vendored copies left out) with its
    size in bytes, sorted by path: listing costs a stat each, parsing waits for a draw."""
    base = Path(root)
    out = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if _SKIP_DIRS & set(rel.split("/")[:-1]) or "-" in rel:
            continue
        size = path.stat().st_size
        if 0 < size <= _MAX_FILE_CHARS:
            out.append((rel, size))
    return tuple(out)


@functools.lru_cache(maxsize=2048)
def load_module(root: str, rel: str) -> Module | None:
    """What the questions need of one module, or None when it is not UTF-8 Python."""
    try:
        text = (Path(root) / rel).read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    return Module(
        rel=rel,
        chars=len(header(rel)) + len(text) + 1,
        defined=frozenset(
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ),
        calls=tuple(sorted(function_calls(tree).items())),
        constants=tuple(sorted(literal_constants(tree).items())),
    )


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _own_nodes(func: ast.AST) -> list[ast.AST]:
    """The nodes of a function's own body: nested functions, classes and lambdas left out."""
    out, todo = [], list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        if isinstance(node, _SCOPES):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def called_names(func: ast.AST) -> set[str]:
    """The names a function calls directly: `Y(...)` and `anything.Y(...)`."""
    names = set()
    for node in _own_nodes(func):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return names


def function_calls(tree: ast.AST) -> dict[str, int]:
    """For each called name, how many functions (and methods, nested ones on their own) of
    the module call it."""
    counts: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for name in called_names(node):
                counts[name] = counts.get(name, 0) + 1
    return counts


_CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def literal_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = literal` (int, float, str or bool) assigned exactly once, with
    the value as text: the number's value, the string itself."""
    seen: dict[str, int] = {}
    values: dict[str, str] = {}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    seen[name.id] = seen.get(name.id, 0) + 1
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and _CONSTANT_NAME.fullmatch(target.id)):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        if type(value) in (int, float, bool) or (
            isinstance(value, str) and 0 < len(value) <= 60 and "\n" not in value
        ):
            values[target.id] = str(value)
    return {name: value for name, value in values.items() if seen.get(name) == 1}


@dataclass(frozen=True)
class RepoTask:
    name: str
    question: str
    expected_answer: str
    context_chars: int
    root: str
    files: tuple[str, ...]
    kind: str

    def write_context(self, path: Path) -> None:
        """The modules' sources, each under its header, in the order drawn."""
        base = Path(self.root)
        with open(path, "w", encoding="utf-8") as out:
            for rel in self.files:
                out.write(header(rel))
                out.write((base / rel).read_text(encoding="utf-8"))
                out.write("\n")


def make_repoqa(tokens: int, seed: int, root: Path | None = None) -> RepoTask:
    """Modules drawn at random until `tokens` are filled, then a question about them whose
    answer the code decides. ValueError when no module fits in `tokens`."""
    base = str(root or stdlib_root())
    rng = random.Random(f"repoqa:{tokens}:{seed}")
    chosen = _draw_modules(base, tokens * CHARS_PER_TOKEN, rng)
    if not chosen:
        raise ValueError(f"no module of {base} fits in {tokens:,} tokens; raise tokens")
    for kind in rng.sample(KINDS, len(KINDS)):
        asked = _ASK[kind](chosen, rng)
        if asked is not None:
            question, expected = asked
            return RepoTask(
                name="repoqa",
                question=question,
                expected_answer=expected,
                context_chars=sum(m.chars for m in chosen),
                root=base,
                files=tuple(m.rel for m in chosen),
                kind=kind,
            )
    raise ValueError(f"no repoqa question can be asked of {len(chosen)} modules; raise tokens")


def _draw_modules(root: str, budget: int, rng: random.Random) -> list[Module]:
    """Modules in a random order, each taken while it still fits in `budget` characters."""
    order = list(source_files(root))
    rng.shuffle(order)
    chosen, used = [], 0
    for rel, size in order:
        if used + size > budget:  # bytes >= characters: a file too big here stays too big
            continue
        module = load_module(root, rel)
        if module is not None and used + module.chars <= budget:
            chosen.append(module)
            used += module.chars
        if budget - used < 400:
            break
    return chosen


def _ask_defines(chosen: list[Module], rng: random.Random) -> tuple[str, str] | None:
    owners: dict[str, list[Module]] = {}
    for module in chosen:
        for name in module.defined:
            owners.setdefault(name, []).append(module)
    unique = sorted(name for name, where in owners.items() if len(where) == 1)
    if not unique:
        return None
    name = rng.choice(unique)
    module = owners[name][0]
    return (
        f"Which module of the source files above defines the function or class `{name}` at "
        "its top level? Answer with the module name only, as its file header gives it.",
        module_name(module.rel),
    )


def _ask_calls(chosen: list[Module], rng: random.Random) -> tuple[str, str] | None:
    options = [(m, name, n) for m in chosen for name, n in m.calls if name.isidentifier()]
    if not options:
        return None
    module, name, count = rng.choice(options)
    return (
        f"How many functions in module {module_name(module.rel)} call `{name}`? Count each "
        "function or method once if its own body (not a nested function or class) calls "
        f"`{name}(...)` or `something.{name}(...)`. Answer with the number only.",
        str(count),
    )


def _ask_constant(chosen: list[Module], rng: random.Random) -> tuple[str, str] | None:
    options = [(m, name, value) for m in chosen for name, value in m.constants]
    if not options:
        return None
    module, name, value = rng.choice(options)
    return (
        f"What is the value of the constant `{name}` in module {module_name(module.rel)}? "
        "Answer with the value only (a string without its quotes).",
        value,
    )


_ASK = {"defines": _ask_defines, "calls": _ask_calls, "constant": _ask_constant}

_EDGE = "`'\" \t\n.,;:"


def _normal(text: str) -> str:
    text = text.strip().strip(_EDGE).removesuffix(".py")
    return text.replace("/", ".").removesuffix(".__init__")


def score_repoqa(expected: str, answer: str) -> float:
    """1 for the exact answer: the module name (a path or `.py` accepted), the count (the
    first number in the reply), the constant's value (quotes or a number's other spelling,
    such as 0x10 for 16, accepted); 0 otherwise."""
    got, want = _normal(answer or ""), _normal(expected)
    if got == want or _literal(got) == want:
        return 1.0
    if re.fullmatch(r"-?\d+", want):
        first = re.search(r"-?\b\d+\b", answer or "")
        return 1.0 if first and int(first.group()) == int(want) else 0.0
    return 0.0


def _literal(text: str) -> str | None:
    """A Python literal's value as text (`0x10` -> `16`, `'a'` -> `a`), or None."""
    try:
        return str(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
