"""The lazy context (runs/sandbox/lazytext.py), fragments as workers load them
(workers/fragments.py), the BM25 fragment index (runs/engine/fragindex.py) and the offset index
cache (runs/engine/context.py), against real files."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from runs.engine import fragindex
from runs.engine.context import context_prepare
from runs.sandbox import Sandbox, SandboxLimits, lazytext
from runs.sandbox.lazytext import LazyText, build_index
from workers import fragments

ALPHABET = "ab c\né€𝄞xyz."


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny checkpoints and blocks, so that every boundary case is met on a small file."""
    monkeypatch.setattr(lazytext, "INDEX_STEP", 37)
    monkeypatch.setattr(lazytext, "BLOCK_CHARS", 101)


def write(tmp_path: Path, text: str) -> tuple[Path, LazyText]:
    path = tmp_path / "context.txt"
    path.write_text(text, encoding="utf-8")
    return path, LazyText(str(path))


def random_text(seed: int, n: int = 4000) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def test_it_slices_like_a_str_across_multibyte_characters(
    small_steps: None, tmp_path: Path
) -> None:
    text = random_text(1)
    _path, context = write(tmp_path, text)
    rng = random.Random(2)
    assert len(context) == len(text)
    for _ in range(1500):
        a, b = rng.randint(-50, 4050), rng.randint(-50, 4050)
        assert context[a:b] == text[a:b]
    assert context[::7] == text[::7]
    assert context[-1] == text[-1]
    with pytest.raises(IndexError):
        context[len(text)]


def test_it_finds_and_counts_like_a_str(small_steps: None, tmp_path: Path) -> None:
    text = random_text(3)
    _path, context = write(tmp_path, text)
    for sub in ["ab", "𝄞x", "é€", "c\né", "not there"]:
        assert context.find(sub) == text.find(sub)
        assert context.rfind(sub) == text.rfind(sub)
        assert context.count(sub) == text.count(sub)
        assert (sub in context) == (sub in text)
    assert context.find("ab", 1000, 2000) == text.find("ab", 1000, 2000)
    assert list(context.lines()) == text.splitlines()
    assert "".join(context) == text


def test_it_streams_a_regex_search_with_whole_context_offsets(
    small_steps: None, tmp_path: Path
) -> None:
    text = random_text(4)
    _path, context = write(tmp_path, text)
    expected = [(m.span(), m.group()) for m in re.finditer(r"[a-c]+ ?x?", text)]
    assert [(m.span(), m.group()) for m in context.search(r"[a-c]+ ?x?")] == expected


def test_it_cuts_chunks_by_chars_lines_and_tokens_with_overlap(
    small_steps: None, tmp_path: Path
) -> None:
    text = "\n".join(f"line {i} has some words, and punctuation." for i in range(300))
    _path, context = write(tmp_path, text)
    by_chars = context.chunks(500, overlap=100)
    assert [f.start for f in by_chars[:3]] == [0, 400, 800]
    assert by_chars[-1].end == len(text)
    assert all(f.text() == text[f.start : f.end] for f in by_chars)
    by_lines = context.chunks(10, overlap=2, by="lines")
    first, second = by_lines[0].text(), by_lines[1].text()
    assert first.count("\n") == 10 and first.startswith("line 0 ")
    assert second.startswith("line 8 ")
    assert by_lines[-1].end == len(text)
    by_tokens = context.chunks(40, overlap=5, by="tokens")
    assert all(30 <= len(re.findall(r"\w+|[^\w\s]", f.text())) <= 41 for f in by_tokens[:-1])
    snapped = context.chunks(333, snap="\n")
    assert "".join(f.text() for f in snapped) == text
    assert all(f.text().endswith("\n") for f in snapped[:-1])


def test_it_makes_fragments_a_worker_loads_and_checks(tmp_path: Path) -> None:
    path, context = write(tmp_path, "héllo " * 1000 + "the needle is here " + "wörld " * 1000)
    at = context.find("the needle")
    fragment = context.fragment(at, at + 19)
    prompt = "Read this: " + fragment
    assert "the needle" not in prompt  # a reference travels, not the text
    filled, loaded = fragments.fill(prompt)
    assert filled == "Read this: the needle is here "
    assert loaded[0]["bytes"] == 19 and loaded[0]["path"] == str(path)
    assert fragment.sha256 == hashlib.sha256(b"the needle is here ").hexdigest()

    path.write_text(path.read_text().replace("needle", "pebble"))
    with pytest.raises(fragments.FragmentError, match="the context changed since the run"):
        fragments.fill(prompt)
    path.unlink()
    with pytest.raises(fragments.FragmentError, match="is not on this worker"):
        fragments.fill(prompt)


def test_a_child_rlms_fragment_is_copied_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rlm_query(q, context=fragment) copies the fragment to the child's own file, in the
    conductor, which serves every user's runs: it read the range whole, as bytes and again
    as text (a review: one line of REPL code over a context of gigabytes cost the conductor
    that many gigabytes). The copy streams; multibyte characters across its chunks and a
    changed context still come out as `read` gives them."""
    import tracemalloc

    from runs.engine.rlm_context import _fragment_file
    from runs.sandbox import SandboxCallError

    monkeypatch.setattr(fragments, "COPY_CHUNK", 1 << 16, raising=False)
    text = random_text(7, 1_000_000) * 3 + "é" * 500_000
    path, context = write(tmp_path, text)
    fragment = context.fragment(5, len(text))
    ref = fragments.parse_ref(json.dumps(fragment.ref()))
    target = tmp_path / "child.txt"
    tracemalloc.start()
    try:
        chars = _fragment_file(ref, target).chars
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert chars == len(text) - 5 and target.read_text(encoding="utf-8") == text[5:]
    size = path.stat().st_size
    assert peak < size / 4, f"peak {peak:,} bytes to copy {size:,}"
    path.write_text(text.replace("é", "e"), encoding="utf-8")
    with pytest.raises(SandboxCallError, match="the context changed since the run"):
        _fragment_file(ref, target)
    assert not target.exists()


@pytest.mark.parametrize(
    "marker, message",
    [
        ("<<frlm:fragment {not json}>>", "not valid JSON"),
        (
            '<<frlm:fragment {"path": "/x", "chars": [5, 1], "bytes": [0, 1], "sha256": "ab"}>>',
            "chars must be",
        ),  # fmt: skip
        (
            '<<frlm:fragment {"path": "/x", "chars": [0, 1], "bytes": [0, 1], "sha256": "ab"}>>',
            "64 hex digits",
        ),  # fmt: skip
    ],
)
def test_it_rejects_a_malformed_fragment_marker(marker: str, message: str) -> None:
    with pytest.raises(fragments.FragmentError, match=message):
        fragments.fill("prompt " + marker)


def test_it_maps_invalid_utf8_bytes_to_one_character_each(tmp_path: Path) -> None:
    raw = "héllo ".encode() * 50 + b"\xff\xfe bad \xe2\x82" + "tail é".encode() * 20
    path = tmp_path / "broken.txt"
    path.write_bytes(raw)
    index = build_index(str(path))
    context = LazyText(str(path), index)
    escaped = raw.decode("utf-8", "surrogateescape")
    assert index.invalid == 4 and index.first_invalid_byte == raw.index(b"\xff")
    assert str(context) == re.sub("[\udc80-\udcff]", "\ufffd", escaped)
    fragment = context.fragment(295, 320)
    assert (
        raw[fragment.byte_start : fragment.byte_end].decode("utf-8", "surrogateescape")
        == (escaped[295:320])
    )


def test_it_refuses_to_read_a_context_whole_past_the_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _path, context = write(tmp_path, "x" * 10_000)
    monkeypatch.setattr(lazytext, "memory_limit_bytes", lambda: 20_000)
    with pytest.raises(MemoryError, match=r"use slices \(context\[a:b\]\), context.chunks"):
        str(context)
    with pytest.raises(MemoryError, match=r"context.upper\(\) would read the whole context"):
        context.upper()
    assert context[:3] == "xxx" and context.count("xx") == 5_000


def test_it_keeps_the_offset_index_until_the_file_changes(
    tmp_path: Path, settings: pytest.FixtureRequest
) -> None:
    settings.FRLM_CONTEXT_DIR = tmp_path / "contexts"  # type: ignore[attr-defined]
    settings.FRLM_CONTEXT_ROOTS = [tmp_path]  # type: ignore[attr-defined]
    path = tmp_path / "corpus.txt"
    path.write_text("first version\n" * 100)
    first = context_prepare("r1", path)
    index_file = first.index_path
    stamp = index_file.stat().st_mtime_ns
    again = context_prepare("r2", path)
    assert again.sha256 == first.sha256 and index_file.stat().st_mtime_ns == stamp
    path.write_text("second version, longer\n" * 100)
    changed = context_prepare("r3", path)
    assert changed.sha256 != first.sha256 and changed.chars == len("second version, longer\n") * 100
    assert json.loads(index_file.read_text())["sha256"] == changed.sha256


def test_it_cuts_passages_at_line_breaks_and_ranks_them_by_bm25(tmp_path: Path) -> None:
    lines = [f"ferry {i} leaves the harbour for the islands every morning" for i in range(2000)]
    lines[1500] = "the launch window opens on tuesday at dawn"
    path, context = write(tmp_path, "\n".join(lines))
    bounds = fragindex.passages(context)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(context)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(context[e - 1] == "\n" for _s, e in bounds[:-1])
    index_json = tmp_path / "offsets.json"
    index_json.write_text(json.dumps(context.index.to_dict()))
    sha = context.index.sha256
    picked = fragindex.select(tmp_path / "data", path, index_json, sha, "launch window", 3)
    assert picked["index"] == "built" and picked["passages"] == len(bounds)
    start, end = picked["fragments"][0]["chars"]
    assert "launch window opens" in context[start:end]
    nothing = fragindex.select(tmp_path / "data", path, index_json, sha, "zzzz qqqq", 3)
    assert nothing["index"] == "cached" and nothing["fragments"] == []


def test_it_serves_a_context_bigger_than_the_repl_memory_limit(tmp_path: Path) -> None:
    memory_mb = 192
    path = tmp_path / "big.txt"
    block = ("The quick brown fox jumps over the lazy dog. " * 23 + "\n").encode()
    with path.open("wb") as out:
        for i in range((memory_mb + 64) * 1024 * 1024 // len(block)):
            out.write(block if i != 4000 else block.replace(b"lazy dog", b"NEEDLE!!", 1))
        out.write(b"the very end")
    size = path.stat().st_size
    assert size > memory_mb * 1024 * 1024
    limits = SandboxLimits(memory_mb=memory_mb, cell_wall_s=120)
    with Sandbox(
        path, handler=lambda n, k: None, limits=limits, workdir_root=tmp_path / "w"
    ) as box:
        result = box.execute(
            "print(len(context), context[-12:], context.count('NEEDLE'))\n"
            "at = context.find('NEEDLE')\n"
            "print(context[at:at + 6], sum(1 for _ in context.lines()))"
        )
        whole = box.execute("text = str(context)")
    assert result.error is None, result.stderr
    lines = size // len(block) + 1
    assert result.stdout == f"{size} the very end 1\nNEEDLE {lines}\n"
    assert whole.error == "memory"
    assert "would read the whole context" in whole.stderr


def test_it_handles_a_zero_byte_context(tmp_path: Path) -> None:
    path, context = write(tmp_path, "")
    assert len(context) == 0 and not context and context[:10] == ""
    assert context.find("x") == -1 and list(context.lines()) == [] and context.chunks(10) == []
    assert fragindex.passages(context) == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b"\x7fELF\x02\x01\x00\x00binary", "is binary, not text; give a text file"),
    ],
)
def test_it_refuses_an_empty_or_binary_context_before_the_run(
    tmp_path: Path, settings: pytest.FixtureRequest, content: bytes, message: str
) -> None:
    from runs.services import ContextSpec, RunInputError, run_create
    from tests.helpers import local_venue
    from workers.backends import model_spec

    local_venue()
    settings.FRLM_CONTEXT_ROOTS = [tmp_path]  # type: ignore[attr-defined]
    path = tmp_path / "context.bin"
    path.write_bytes(content)
    with pytest.raises(RunInputError) as caught:
        run_create(
            question="anything",
            context=ContextSpec(path=str(path)),
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )
    assert message in caught.value.errors["context"]
    missing = ContextSpec(path=str(tmp_path / "nowhere.txt"))
    with pytest.raises(RunInputError, match="does not exist; check the spelling"):
        run_create(
            question="anything",
            context=missing,
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )
