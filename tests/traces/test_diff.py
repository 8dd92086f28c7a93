"""Trace diff (ARCHITECTURE.md §7): hand-made span trees with known answers, then
`manage.py frlm_diff` on two real runs."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from frlm_web.commands import _json_default
from frlm_web.money import is_money_str
from tests.helpers import finish, launch, scripted, trace
from traces.diff import NodeDelta, TraceDiff, TraceDiffError, lcs_pairs, trace_diff
from traces.store import SpanNode

T0 = 1_700_000_000_000_000_000  # ns: when every hand-made run starts
TEMPLATE = "Find the special magic number for 'key-{i}' in the text below.\n\nTEXT:\n{text}"


@dataclass
class Batch:
    """One llm_query_batched call: `size` prompts from one template."""

    template: str = TEMPLATE
    size: int = 20
    venues: tuple[str, ...] = ("local", "edge")  # taken in turn
    cancelled: int = 0  # the last ones, cancelled once the quorum was reached
    ms: float = 40.0
    tokens: tuple[int, int] = (100, 5)
    cost: float = 0.001
    reply: str = "NONE"


@dataclass
class Turn:
    code: str
    prose: str = "Next step."
    batches: list[Batch] = field(default_factory=list)
    output: str = ""
    open: bool = False  # still running: the reply is not written yet
    child: Run | None = None  # an rlm_query made by this turn's cell
    fragments: list[str] | None = None  # what the cell's fragment selection picked


@dataclass
class Run:
    turns: list[Turn]
    question: str = "What is the magic number?"
    answer: str = "42"


class Trace:
    """A run built by hand: its span tree, and the texts its payload refs stand for. Refs
    are not content addressed here, so equal texts under different refs must compare
    equal, as they do through the store."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self._ids = itertools.count(1)

    def ref(self, text: str | None) -> str | None:
        if text is None:
            return None
        ref = f"ref{len(self.texts)}"
        self.texts[ref] = text
        return ref

    def span(
        self,
        name: str,
        parent: SpanNode | None,
        at_ms: float,
        ms: float | None,
        *,
        put: str | None = None,
        got: str | None = None,
        status: str = "ok",
        depth: int = 0,
        **attrs: object,
    ) -> SpanNode:
        node = SpanNode(
            span_id=f"s{next(self._ids)}",
            parent_id=parent.span_id if parent else None,
            name=name,
            start_ns=T0 + int(at_ms * 1e6),
            end_ns=None if ms is None else T0 + int((at_ms + ms) * 1e6),
            status=status,
            depth=depth,
            ms=ms,
            attrs=dict(attrs),
            start_payload=self.ref(put),
            end_payload=None if ms is None else self.ref(got),
        )
        if parent is not None:
            parent.children.append(node)
        return node

    def instant(self, span: SpanNode, name: str, at_ms: float, **attrs: object) -> None:
        status = "cancelled" if name == "SubQuery.Cancel" else "ok"
        ts = T0 + int(at_ms * 1e6)
        span.instants.append({"name": name, "status": status, "attrs": attrs, "ts": ts})

    def text(self, ref: str) -> str | None:
        return self.texts.get(ref)


def build(run: Run) -> tuple[list[SpanNode], Trace]:
    built = Trace()
    root = built.span("Run.Init", None, 0, 100_000, question=run.question)
    built.instant(root, "Env.LoadFragment", 0.5, chars=20_000)
    end = _rlm(built, run, root, at=1.0, depth=0)
    built.instant(root, "Run.Done", end, answer=run.answer)
    return [root], built


def _rlm(built: Trace, run: Run, parent: SpanNode, *, at: float, depth: int) -> float:
    """The turns of one RLM under `parent`; returns when it ended."""
    for number, turn in enumerate(run.turns, start=1):
        reply = f"{turn.prose}\n\n```repl\n{turn.code}\n```"
        built.span(
            "Run.Decode",
            parent,
            at,
            None if turn.open else 100.0,
            got=reply,
            depth=depth,
            turn=number,
            tokens_in=500,
        )
        at += 100.0
        if turn.open:
            return at
        cell = built.span(
            "Repl.Exec",
            parent,
            at,
            50.0,
            put=turn.code,
            got=turn.output,
            depth=depth,
            turn=number,
            cell=number,
        )
        if turn.fragments is not None:
            built.instant(cell, "Env.SelectFragments", at + 0.5, picked=turn.fragments)
        for batch in turn.batches:
            at = _batch(built, batch, cell, at + 1.0, depth)
        if turn.child is not None:
            submit = built.span(
                "SubQuery.Submit",
                cell,
                at + 1.0,
                500.0,
                put="What is the number in this part?",
                got="7",
                depth=depth + 1,
                kind="rlm",
                venue="conductor",
            )
            at = _rlm(built, turn.child, submit, at=at + 2.0, depth=depth + 1)
        at += 60.0
    return at


def _batch(built: Trace, batch: Batch, cell: SpanNode, at: float, depth: int) -> float:
    kept = batch.size - batch.cancelled
    for i in range(batch.size):
        start = at + i * 0.1
        venue = batch.venues[i % len(batch.venues)]
        prompt = batch.template.format(i=i, text=f"filler {i} " * 30)
        if i >= kept:
            submit = built.span(
                "SubQuery.Submit",
                cell,
                start,
                batch.ms,
                put=prompt,
                status="cancelled",
                depth=depth,
                venue=venue,
                route="most free credit: 1 of 8 in use",
            )
            built.instant(
                submit,
                "SubQuery.Cancel",
                at + batch.ms,
                reason=f"quorum of {kept}/{batch.size} reached",
            )
            continue
        submit = built.span(
            "SubQuery.Submit",
            cell,
            start,
            batch.ms + 2,
            put=prompt,
            got=batch.reply,
            depth=depth,
            venue=venue,
            route=f"most free credit: {i % 8} of 8 in use",
        )
        execute = built.span(
            "SubQuery.Execute", submit, start + 1, batch.ms, got=batch.reply, depth=depth
        )
        execute.tokens_in, execute.tokens_out = batch.tokens
        execute.cost = batch.cost
        built.instant(submit, "SubQuery.Return", start + batch.ms + 2)
    return at + batch.size * 0.1 + batch.ms + 2


def diff_of(a: Run, b: Run) -> TraceDiff:
    roots_a, built_a = build(a)
    roots_b, built_b = build(b)
    texts = {**built_a.texts, **{f"b:{k}": v for k, v in built_b.texts.items()}}
    _prefix_refs(roots_b, "b:")
    return trace_diff(roots_a, roots_b, text=texts.get)


def _prefix_refs(roots: list[SpanNode], prefix: str) -> None:
    """Give B's refs their own names, so no ref means the same on both sides by chance."""
    todo = list(roots)
    while todo:
        span = todo.pop()
        if span.start_payload:
            span.start_payload = prefix + span.start_payload
        if span.end_payload:
            span.end_payload = prefix + span.end_payload
        todo.extend(span.children)


def node(diff: TraceDiff, *tail: str) -> NodeDelta:
    """The one aligned node whose path ends with these keys."""
    (found,) = [n for n in diff["nodes"] if tuple(n["path"][-len(tail) :]) == tail]
    return found


def three_turns(*, code2: str = "print(len(rs))", batch3: int = 10) -> Run:
    return Run(
        turns=[
            Turn(
                "rs = llm_query_batched(prompts)",
                batches=[Batch(size=20)],
                output="20",
            ),
            Turn(code2, output="20"),
            Turn("FINAL(rs[0])", batches=[Batch(size=batch3)]),
        ]
    )


# Digits made '#', spacing collapsed, the first 80 characters kept.
SUBMIT = (
    "SubQuery.Submit[Find the special magic number for 'key-#' in the text below. TEXT: "
    "filler # fill]"
)


# --- pure trees --------------------------------------------------------------------------------
def test_it_finds_no_difference_between_identical_runs():
    diff = diff_of(three_turns(), three_turns())
    assert diff["first_divergence"] is None
    assert diff["only_in_a"] == [] and diff["only_in_b"] == []
    assert diff["routing"] == [] and diff["inputs"] == []
    assert not [n["path"] for n in diff["nodes"] if n["changed"]]
    assert diff["summary"]["nodes_a"] == diff["summary"]["nodes_b"] == diff["summary"]["aligned"]
    json.dumps(diff)  # the web page gets the same result


def test_it_condenses_a_batch_of_one_template_into_one_node_with_a_count():
    a = Run([Turn("rs = llm_query_batched(prompts)", batches=[Batch(size=20)])])
    b = Run([Turn("rs = llm_query_batched(prompts)", batches=[Batch(size=18)])])
    diff = diff_of(a, b)
    submit = node(diff, SUBMIT)
    assert submit["count"] == {"a": 20, "b": 18, "delta": -2}
    assert submit["input"]["differing"] == 2  # the prompts for key-18 and key-19
    assert submit["output"] is None  # more copies of one reply are a count, not a text change
    assert node(diff, "SubQuery.Execute")["count"] == {"a": 20, "b": 18, "delta": -2}
    assert submit["path"] == ["Run.Init", "Repl.Exec[turn=1 cell=1]", SUBMIT]
    # Run.Init, Decode, Exec, Submit, Execute: 20 spans collapse into one node per side.
    assert diff["summary"]["nodes_a"] == diff["summary"]["nodes_b"] == 5
    assert diff["summary"]["spans_a"] == 43 and diff["summary"]["spans_b"] == 39
    assert diff["only_in_a"] == [] and diff["only_in_b"] == []
    assert diff["first_divergence"]["kind"] == "structure"
    assert diff["first_divergence"]["path"] == submit["path"]


def test_it_aligns_siblings_so_only_the_inserted_node_is_one_sided():
    def cell(*words: str) -> Run:
        batches = [
            Batch(template=f"Task {w}: summarise part {{i}}.\n{{text}}", size=3) for w in words
        ]
        return Run([Turn("rs = [llm_query_batched(p) for p in parts]", batches=batches)])

    diff = diff_of(cell("alpha", "beta", "gamma"), cell("alpha", "delta", "beta", "gamma"))
    assert diff["only_in_a"] == []
    (inserted,) = diff["only_in_b"]
    assert inserted["path"] == [
        "Run.Init",
        "Repl.Exec[turn=1 cell=1]",
        "SubQuery.Submit[Task delta: summarise part #. filler # filler # filler # filler # "
        "filler # fille]",
    ]
    assert inserted["count"] == 3 and inserted["spans"] == 6  # its Execute children go with it
    aligned = [n["path"][-1] for n in diff["nodes"] if n["name"] == "SubQuery.Submit"]
    assert [key.split(":")[0] for key in aligned] == [
        "SubQuery.Submit[Task alpha",
        "SubQuery.Submit[Task beta",
        "SubQuery.Submit[Task gamma",
    ]
    assert diff["first_divergence"]["kind"] == "structure"
    assert diff["first_divergence"]["path"] == inserted["path"]
    assert diff["first_divergence"]["a"]["present"] is False


def test_it_finds_the_longest_common_subsequence_of_keys():
    a, b = list("abcdef"), list("xbdcefy")
    pairs = lcs_pairs(a, b)
    assert len(pairs) == 4  # b, c or d, e, f
    assert all(a[i] == b[j] for i, j in pairs)
    assert pairs == sorted(pairs) and [j for _, j in pairs] == sorted(j for _, j in pairs)
    assert lcs_pairs([], list("ab")) == [] and lcs_pairs(list("ab"), list("ba")) in (
        [(0, 1)],
        [(1, 0)],
    )


def test_it_names_changed_code_of_turn_2_as_the_first_divergence_though_later_nodes_differ():
    diff = diff_of(three_turns(), three_turns(code2="print(rs[:3])", batch3=12))
    first = diff["first_divergence"]
    assert first["kind"] == "code"
    assert first["path"] == ["Run.Init", "Repl.Exec[turn=2 cell=2]"]
    assert first["a"]["value"] == "print(len(rs))"
    assert first["b"]["value"] == "print(rs[:3])"
    assert first["diff"] == ["@@ -1 +1 @@", "-print(len(rs))", "+print(rs[:3])"]
    assert first["a"]["offset_ms"] == first["b"]["offset_ms"] > 0
    # The later batch of 10 vs 12 is reported, but it is not the first divergence.
    assert node(diff, "Repl.Exec[turn=3 cell=3]", SUBMIT)["count"]["delta"] == 2


def test_it_names_a_different_reply_when_the_code_is_the_same():
    a, b = three_turns(), three_turns()
    b.turns[1].prose = "Let me look at the replies."
    first = diff_of(a, b)["first_divergence"]
    assert first["kind"] == "reply"
    assert first["path"] == ["Run.Init", "Run.Decode[turn=2]"]
    assert "Let me look at the replies." in first["b"]["value"]


def test_it_names_a_different_fragment_selection():
    a, b = three_turns(), three_turns()
    a.turns[0].fragments = ["a.txt:0-4000", "b.md:0-4000"]
    b.turns[0].fragments = ["a.txt:0-4000", "c.log:8000-12000"]
    first = diff_of(a, b)["first_divergence"]
    assert (first["kind"], first["path"]) == ("fragments", ["Run.Init", "Repl.Exec[turn=1 cell=1]"])
    assert "b.md:0-4000" in first["a"]["value"] and "c.log:8000-12000" in first["b"]["value"]


def test_it_names_a_quorum_cancel_on_one_side_as_the_first_divergence():
    a, b = three_turns(), three_turns()
    b.turns[0].batches = [Batch(size=20, cancelled=8)]
    b.turns[1].output = "12"  # fewer replies came back, and later nodes differ too
    diff = diff_of(a, b)
    first = diff["first_divergence"]
    assert first["kind"] == "quorum"
    assert first["path"] == ["Run.Init", "Repl.Exec[turn=1 cell=1]", SUBMIT]
    assert first["a"]["value"] == "20 sub-queries: none cancelled or timed out"
    assert first["b"]["value"] == "20 sub-queries: 8 cancelled (quorum of 12/20 reached)"
    assert first["b"]["offset_ms"] > first["a"]["offset_ms"]  # when the cancel came
    submit = node(diff, "Repl.Exec[turn=1 cell=1]", SUBMIT)
    assert submit["instants"]["SubQuery.Cancel"] == {"a": 0, "b": 8, "delta": 8}
    assert submit["statuses"]["cancelled"] == {"a": 0, "b": 8, "delta": 8}


def test_it_reports_a_venue_difference_but_not_as_the_first_divergence():
    a, b = three_turns(), three_turns(code2="print(rs[:3])")
    a.turns[0].batches = [Batch(size=20, venues=("local",))]
    b.turns[0].batches = [Batch(size=20, venues=("edge",))]
    diff = diff_of(a, b)
    (routing,) = diff["routing"]
    assert routing["path"][-1] == SUBMIT
    assert routing["venues_a"] == {"local": 20} and routing["venues_b"] == {"edge": 20}
    assert routing["routes_a"] == routing["routes_b"]  # load figures are normalised away
    assert diff["first_divergence"]["kind"] == "code"  # the later decision, not the venue


def test_it_names_a_venue_difference_only_when_nothing_else_differs():
    a, b = three_turns(), three_turns()
    b.turns[2].batches = [Batch(size=10, venues=("edge",))]
    first = diff_of(a, b)["first_divergence"]
    assert first["kind"] == "routing"
    assert "not deterministic" in first["what"]
    assert first["a"]["value"].startswith("edge×5, local×5")
    assert first["b"]["value"].startswith("edge×10")


def test_it_lists_a_different_task_as_an_input_and_not_the_venues_order():
    """Two runs of one question over different generated contexts: the inputs say so (they
    listed nothing, and put it down to the root model's reply, a review); the same venues
    in another order are no difference."""
    roots_a, _ = build(three_turns())
    roots_b, _ = build(three_turns())
    roots_a[0].attrs.update(
        task={"name": "sniah", "tokens": 20000, "seed": 1},
        context_bytes=80_000,
        venues=["local", "edge"],
    )
    roots_b[0].attrs.update(
        task={"name": "sniah", "tokens": 40000, "seed": 2},
        context_bytes=160_000,
        venues=["edge", "local"],
    )
    inputs = {c["field"]: c for c in trace_diff(roots_a, roots_b)["inputs"]}
    assert set(inputs) == {"task", "context_bytes"}
    assert '"seed":2' in inputs["task"]["b"].replace(" ", "")


def test_it_computes_latency_token_and_cost_deltas():
    a = Run([Turn("x", batches=[Batch(size=10, ms=40.0, tokens=(100, 5), cost=0.001)])])
    b = Run([Turn("x", batches=[Batch(size=10, ms=50.0, tokens=(120, 5), cost=0.002, reply="7")])])
    diff = diff_of(a, b)
    execute = node(diff, "SubQuery.Execute")
    assert execute["ms_total"] == {"a": 400.0, "b": 500.0, "delta": 100.0}
    assert execute["ms_mean"] == {"a": 40.0, "b": 50.0, "delta": 10.0}
    assert execute["tokens_in"] == {"a": 1000, "b": 1200, "delta": 200}
    assert execute["tokens_out"]["delta"] == 0
    assert execute["cost"] == {"a": 0.01, "b": 0.02, "delta": 0.01}
    assert execute["changed"] is True
    assert execute["output"]["differing"] == 10
    assert (execute["output"]["a"], execute["output"]["b"]) == ("NONE", "7")
    assert node(diff, SUBMIT)["ms_mean"]["delta"] == 10.0
    assert node(diff, "Run.Decode[turn=1]")["changed"] is False


def test_it_handles_open_spans_instants_and_runs_of_different_depth():
    child = Run([Turn("FINAL(context[:1])")])
    a = Run([Turn("part = context[:100]"), Turn("FINAL(part)", open=True)])
    b = Run([Turn("part = context[:100]", child=child), Turn("FINAL(part)")])
    diff = diff_of(a, b)
    json.dumps(diff)
    assert diff["summary"]["open_a"] == 1 and diff["summary"]["open_b"] == 0
    rlm_key = "SubQuery.Submit[rlm: What is the number in this part?]"
    only = {tuple(n["path"]): n for n in diff["only_in_b"]}
    child_path = ("Run.Init", "Repl.Exec[turn=1 cell=1]", rlm_key)
    assert only[child_path]["spans"] == 3  # the Submit and the child's Decode and Exec
    assert ("Run.Init", "Repl.Exec[turn=2 cell=2]") in only  # A has not run it yet
    first = diff["first_divergence"]
    assert (first["kind"], first["path"]) == ("structure", list(child_path))
    decode = node(diff, "Run.Decode[turn=2]")
    assert decode["open"] == {"a": 1, "b": 0, "delta": -1}
    assert decode["statuses"]["open"]["a"] == 1
    assert node(diff, "Run.Init")["instants"] == {}  # both runs loaded and finished
    assert diff["answer"] == {"a": "42", "b": "42"}


def test_it_refuses_a_trace_without_spans():
    holder = SpanNode("", None, "(run)")
    holder.instants.append({"name": "Run.Done", "status": "ok", "attrs": {}, "ts": T0})
    roots, built = build(three_turns())
    with pytest.raises(TraceDiffError, match="run 'r-empty' has no spans to compare"):
        trace_diff(roots, [holder], text=built.text, run_b="r-empty")


# --- the command on real runs ----------------------------------------------------------------
def frlm_diff(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "frlm_diff", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.stack
def test_it_diffs_two_real_runs_that_differ_in_their_second_cell(venues, subprocess_env):
    first = (
        "rs = llm_query_batched(['Say the word apple, item %d.' % i for i in range(4)])\n"
        "print(len(rs))"
    )
    run_a = launch(question=scripted(first, "FINAL('alpha')"), venues=venues)
    run_b = launch(question=scripted(first, "FINAL('beta')"), venues=venues)
    for run in (finish(run_a), finish(run_b)):
        assert run.status == "succeeded", run.error
        trace(run)

    done = frlm_diff(subprocess_env, run_a.id, run_b.id, "--json")
    assert done.returncode == 0, done.stderr
    diff = json.loads(done.stdout)
    divergence = diff["first_divergence"]
    assert divergence["kind"] == "code"
    assert divergence["path"] == ["Run.Init", "Repl.Exec[turn=2 cell=2]"]
    assert divergence["a"]["value"] == "FINAL('alpha')"
    assert divergence["b"]["value"] == "FINAL('beta')"
    assert diff["answer"] == {"a": "alpha", "b": "beta"}
    assert [c["field"] for c in diff["inputs"]] == ["question"]
    submit = [n for n in diff["nodes"] if n["name"] == "SubQuery.Submit"]
    assert submit[0]["count"] == {"a": 4, "b": 4, "delta": 0}
    # Money as exact decimal strings, as every command's --json writes it (floats came
    # out as 1.71e-05; a review).
    costs = [n["cost"] for n in diff["nodes"]]
    assert costs and all(set(c) == {"a", "b", "delta"} for c in costs)
    spelled = [v for c in costs for v in c.values()]
    assert all(isinstance(v, str) and is_money_str(v.removeprefix("-")) for v in spelled), spelled
    assert Decimal(submit[0]["cost"]["a"]) > 0

    # The command fetched row tuples (it never imports pyarrow); a process that has Arrow
    # loaded reads the same columns through it (traces.store._columns_many).
    from traces import store

    queries = [(store._SPANS_SQL, None), (store._INSTANTS_SQL, None)]

    def rows(columns: dict) -> list:  # spans come grouped, in no set order
        return sorted(zip(*columns.values(), strict=True), key=repr)

    for run in (run_a, run_b):
        through_arrow = store._columns_many(run.id, queries, arrow=True)
        as_tuples = store._columns_many(run.id, queries, arrow=False)
        assert [list(c) for c in as_tuples] == [list(c) for c in through_arrow]  # names
        assert [rows(c) for c in as_tuples] == [rows(c) for c in through_arrow]

    out = StringIO()
    call_command("frlm_diff", run_a.id, run_b.id, stdout=out)
    text = out.getvalue()
    assert "first divergence: code at Run.Init > Repl.Exec[turn=2 cell=2]" in text
    assert "FINAL('alpha')" in text and "FINAL('beta')" in text
    assert "only in A: 0   only in B: 0" in text


def test_it_names_an_unknown_run_in_a_one_line_error(subprocess_env):
    done = frlm_diff(subprocess_env, "no-such-run", "other-run")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "CommandError: no trace events stored for run 'no-such-run'; check the ids with "
        "`python manage.py frlm_runs`, and that the recorder is running"
    )


def test_it_condenses_a_numbered_batch_whatever_its_prompts_say():
    def tree(count: int) -> list[SpanNode]:
        root = SpanNode("root", None, "Run.Init", start_ns=0, end_ns=10**9)
        for i in range(count):
            # Prompts that start with their fragment share no template; the batch number
            # the fanout puts on each Submit span still makes them one node.
            submit = SpanNode(
                f"s{i}",
                "root",
                "SubQuery.Submit",
                start_ns=i,
                end_ns=i + 10,
                attrs={"batch": 1},
                start_payload=f"p{i}",
            )
            root.children.append(submit)
        return [root]

    texts = {f"p{i}": f"{i * 7919} unrelated fragment text, then the question" for i in range(30)}
    diff = trace_diff(tree(30), tree(28), text=texts.get)
    (batch,) = [n for n in diff["nodes"] if n["path"][-1] == "SubQuery.Submit[batch 1]"]
    assert (batch["count"]["a"], batch["count"]["b"]) == (30, 28)


def test_it_names_spans_a_dead_process_abandoned_in_the_tree_and_the_diff():
    from traces.diff.condense import Stats
    from traces.diff.divergence import _stragglers_text
    from traces.store import format_span_tree

    run = SpanNode("r", None, "Run.Init", start_ns=1, end_ns=9, status="abandoned", ms=2.0)
    run.children.append(
        SpanNode("x", "r", "SubQuery.Execute", start_ns=2, end_ns=3, status="abandoned", ms=0.1)
    )
    text = format_span_tree([run])
    assert "Run.Init 2.0 ms [abandoned]" in text and "SubQuery.Execute 0.1 ms [abandoned]" in text
    a = Stats(count=4, statuses={"ok": 4})
    b = Stats(count=4, statuses={"ok": 2, "abandoned": 2})
    assert a.stragglers != b.stragglers
    assert "2 abandoned by a process that died" in _stragglers_text(b)


def test_its_json_spells_a_small_cost_delta_without_an_exponent():
    from traces.management.commands.frlm_diff import _money_exact

    data = {"nodes": [{"cost": {"a": 0.0231619, "b": 0.0231448, "delta": -1.71e-05}}],
            "only_a": [{"cost": 2e-08, "count": 3}]}  # fmt: skip
    out = json.loads(json.dumps(_money_exact(data), default=_json_default))
    assert out["nodes"][0]["cost"] == {"a": "0.0231619", "b": "0.0231448", "delta": "-0.0000171"}
    assert out["only_a"] == [{"cost": "0.00000002", "count": 3}]
