"""The BM25 index behind select_fragments: the context cut into passages, indexed once per
context and kept on disk under the data dir by the context's sha256.

Building reads the whole context, so it runs in a subprocess (`python -m runs.engine.fragindex`):
its memory is gone when it ends and the conductor stays small whatever the context's size.
A query loads the index memory-mapped. A file that changed has another sha256, so its index
is built anew; the path's last sha256 is remembered to say that the old index was stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TypedDict

from runs.sandbox.lazytext import ContextIndex, LazyText

PASSAGE_CHARS = 2_000  # a passage ends at the last line or word break before this many chars
BUILD_TIMEOUT_S = 3600
_MARKER = "built.json"


class FragmentIndexError(RuntimeError):
    """The index could not be built or read; the message says why."""


class Selected(TypedDict):
    chars: list[int]  # [start, end) in the context
    score: float


class Selection(TypedDict):
    fragments: list[Selected]
    index: str  # "cached", "built" or "rebuilt: ..." (why an older one was not used)
    build_ms: float
    query_ms: float
    passages: int


def index_dir(root: Path, sha256: str) -> Path:
    return root / "bm25" / sha256


def passages(text: LazyText, size: int = PASSAGE_CHARS) -> list[tuple[int, int]]:
    """[start, end) of consecutive passages of about ``size`` characters, cut at a line
    break, else a space, in the second half of the window, else at ``size``."""
    bounds: list[tuple[int, int]] = []
    n = len(text)
    pending, offset = "", 0  # text not yet in a passage, and where it starts
    for at, block in text.blocks():
        pending += block
        final = at + len(block) >= n
        used = 0
        while len(pending) - used >= size or (final and used < len(pending)):
            if final and len(pending) - used <= size:
                bounds.append((offset + used, offset + len(pending)))
                used = len(pending)
                break
            window_end = used + size
            cut = pending.rfind("\n", used + size // 2, window_end)
            if cut == -1:
                cut = pending.rfind(" ", used + size // 2, window_end)
            length = cut + 1 - used if cut != -1 else size
            bounds.append((offset + used, offset + used + length))
            used += length
        pending, offset = pending[used:], offset + used
    return bounds


def build(context_path: str, index_json: str, out: Path) -> dict[str, object]:
    """Index the passages of the context into ``out`` (written to a temporary directory,
    then renamed, so a reader never sees half an index)."""
    import bm25s
    import numpy as np

    started = time.perf_counter()
    with open(index_json, encoding="utf-8") as handle:
        text = LazyText(context_path, ContextIndex(json.load(handle)))
    bounds = passages(text)
    corpus = [text.read(s, e) for s, e in bounds]
    tokens = bm25s.tokenize(corpus, stopwords="en", show_progress=False)
    del corpus
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    retriever.save(str(tmp), show_progress=False)
    np.save(tmp / "passages.npy", np.asarray(bounds, dtype=np.int64).reshape(-1, 2))
    meta = {
        "sha256": text.index.sha256,
        "passages": len(bounds),
        "build_ms": (time.perf_counter() - started) * 1000,
    }
    (tmp / _MARKER).write_text(json.dumps(meta))
    try:
        os.replace(tmp, out)
    except OSError:
        # Another run built the same index meanwhile: the same content, so keep theirs.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / _MARKER).exists():
            raise
    return meta


def ensure(
    root: Path, context_path: Path, index_json: Path, sha256: str
) -> tuple[Path, str, float]:
    """The index directory of this context, built if missing: (dir, how, build ms)."""
    out = index_dir(root, sha256)
    seen = root / "bm25" / "paths" / (_path_key(context_path) + ".json")
    previous = _read_json(seen).get("sha256")
    if (out / _MARKER).exists():
        how, build_ms = "cached", 0.0
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "runs.engine.fragindex", str(context_path)]
        command += [str(index_json), str(out)]
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                cwd=Path(__file__).resolve().parents[2],  # the repository, so `-m runs...` resolves
            )
        except subprocess.TimeoutExpired as exc:
            raise FragmentIndexError(
                f"building the BM25 index took longer than {BUILD_TIMEOUT_S} s"
            ) from exc
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise FragmentIndexError(f"building the BM25 index failed: {said}")
        build_ms = (time.perf_counter() - started) * 1000
        how = "built"
        if previous and previous != sha256:
            how = "rebuilt: the context file changed since its index was built"
            shutil.rmtree(index_dir(root, previous), ignore_errors=True)
    seen.parent.mkdir(parents=True, exist_ok=True)
    seen.write_text(json.dumps({"sha256": sha256, "path": str(context_path)}))
    return out, how, build_ms


def query(directory: Path, text: str, k: int) -> tuple[list[Selected], int]:
    """The ``k`` best passages for ``text``, best first, and the number of passages."""
    import bm25s
    import numpy as np

    retriever = bm25s.BM25.load(str(directory), mmap=True, show_progress=False)
    bounds = np.load(directory / "passages.npy", mmap_mode="r")
    count = int(bounds.shape[0])
    words = bm25s.tokenize([text], stopwords="en", return_ids=False, show_progress=False)[0]
    words = [w for w in words if w in retriever.vocab_dict]
    if not words or count == 0:
        return [], count
    ids, scores = retriever.retrieve([words], k=min(k, count), show_progress=False)
    chosen: list[Selected] = []
    for doc, score in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
        if score <= 0:
            continue
        start, end = (int(v) for v in bounds[doc])
        chosen.append({"chars": [start, end], "score": round(float(score), 4)})
    return chosen, count


def select(
    root: Path, context_path: Path, index_json: Path, sha256: str, text: str, k: int
) -> Selection:
    directory, how, build_ms = ensure(root, context_path, index_json, sha256)
    started = time.perf_counter()
    chosen, count = query(directory, text, k)
    return {
        "fragments": chosen,
        "index": how,
        "build_ms": round(build_ms, 1),
        "query_ms": round((time.perf_counter() - started) * 1000, 2),
        "passages": count,
    }


def _path_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _read_json(path: Path) -> dict[str, object]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m runs.engine.fragindex CONTEXT_FILE OFFSET_INDEX_JSON OUT_DIR")
    print(json.dumps(build(sys.argv[1], sys.argv[2], Path(sys.argv[3]))))
