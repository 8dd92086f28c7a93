"""A server path is a run's context only under FRLM_CONTEXT_ROOTS, and never one of the
server's own files: the services run as root, so anything else a staff user could name
(/etc/shadow, the conductor's key, the database) would be read into the REPL. Checked at
every entry (service, launcher, command) and again where the conductor opens the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client

from runs.engine.context import ContextError, check_path, context_prepare
from runs.models import Run
from runs.sandbox import Sandbox, SandboxError
from runs.services import ContextSpec, RunInputError, run_create, run_launch
from runs.trust.receipts import conductor_key
from tests.helpers import finish, scripted
from tests.pages.helpers import launcher_form, make_user
from workers.backends import model_spec

SECRET = "root:$6$not-for-the-model$:19000:0:99999:7:::\n"


def create(path: str | Path, question: str = "What is in it?") -> Run:
    return run_create(
        question=question,
        context=ContextSpec(path=str(path)),
        root_model=model_spec("sim", role="root"),
        worker_model=model_spec("sim", role="worker"),
        venues=["local"],
    )


def refusal(path: str | Path) -> str:
    with pytest.raises(RunInputError) as caught:
        create(path)
    return caught.value.errors["context"]


@pytest.fixture
def local(db) -> None:
    from tests.helpers import local_venue

    local_venue()


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A text file outside every root, standing for /etc/shadow or a key."""
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def test_it_refuses_etc_shadow_and_says_which_roots_are_allowed(local) -> None:
    message = refusal("/etc/shadow")
    assert "outside the folders contexts may be read from" in message
    assert str(Path(settings.FRLM_CONTEXT_DIR).resolve()) in message
    assert "FRLM_CONTEXT_ROOTS" in message and "upload it instead" in message


def test_it_refuses_the_conductors_signing_key(local) -> None:
    conductor_key()  # made on first use: make sure it is there to be asked for
    assert Path(settings.FRLM_CONDUCTOR_KEY_FILE).is_file()
    assert "server's own files" in refusal(settings.FRLM_CONDUCTOR_KEY_FILE)


def test_it_refuses_the_database_for_what_it_is(local) -> None:
    database = settings.DATABASES["default"]["NAME"]
    assert Path(database).is_file()
    assert "server's own files" in refusal(database)


def test_it_refuses_a_symlink_in_a_root_that_leads_outside(
    local, context_root: Path, secret: Path
) -> None:
    link = context_root / "notes.txt"
    link.symlink_to(secret)
    assert "outside the folders" in refusal(link)
    folder = context_root / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("harmless\n")
    (folder / "b").symlink_to(secret)
    assert "outside the folders" in refusal(folder)


def test_it_refuses_dot_dot_out_of_a_root(local, context_root: Path, secret: Path) -> None:
    climb = os.path.relpath(secret, context_root)
    assert climb.startswith("..")
    assert "outside the folders" in refusal(f"{context_root}/{climb}")


def test_it_keeps_the_servers_files_out_of_a_root_that_holds_them(
    local, settings, tmp_path: Path
) -> None:
    data = Path(settings.DATA_DIR)
    settings.FRLM_CONTEXT_ROOTS = [data]
    conductor_key()
    worker_key = data / "workers" / "edge" / "edge-9.key"
    worker_key.parent.mkdir(parents=True, exist_ok=True)
    worker_key.write_text("-----BEGIN PRIVATE KEY-----\nnot a real one\n")
    for own in (
        settings.FRLM_CONDUCTOR_KEY_FILE,
        data / "keys",
        worker_key,
        settings.DATABASES["default"]["NAME"],
        data / "secret_key",
        settings.FRLM_TRACE_DIR,
        data,  # a folder that holds them
    ):
        assert "server's own files" in refusal(own), own
    notes = data / "notes" / "today.txt"
    notes.parent.mkdir(exist_ok=True)
    notes.write_text("The launch window opens on Tuesday.\n")
    assert create(notes).context_path == str(notes.resolve())


def test_it_takes_a_file_under_a_configured_root(local, settings, tmp_path: Path) -> None:
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    (corpora / "notes.txt").write_text("The launch window opens on Tuesday.\n")
    assert "FRLM_CONTEXT_ROOTS" in refusal(corpora / "notes.txt")
    settings.FRLM_CONTEXT_ROOTS = [tmp_path / "elsewhere", corpora]
    assert create(corpora / "notes.txt").context_source == Run.Source.PATH


def test_it_refuses_a_context_swapped_after_the_check_when_the_conductor_opens_it(
    settings, context_root: Path, secret: Path
) -> None:
    # Checked as run_create and the conductor check it, then swapped before it is opened:
    # the file itself for a symlink, or a folder on its path for one.
    settings.FRLM_CONTEXT_ROOTS = [context_root]
    (context_root / "docs").mkdir()
    path = context_root / "docs" / secret.name
    path.write_text("The launch window opens on Tuesday.\n")
    checked = check_path(str(path))
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(ContextError, match="symbolic link"):
        context_prepare("rswap", checked)
    path.unlink()
    (context_root / "docs").rmdir()
    (context_root / "docs").symlink_to(secret.parent)
    with pytest.raises(ContextError, match="outside the folders"):
        context_prepare("rswap", checked)


def test_it_starts_no_repl_over_a_context_replaced_after_it_was_indexed(
    settings, context_root: Path, tmp_path: Path
) -> None:
    settings.FRLM_CONTEXT_ROOTS = [context_root]
    path = context_root / "notes.txt"
    path.write_text("The launch window opens on Tuesday.\n")
    prepared = context_prepare("rswap", path)
    swapped = context_root / "swapped.tmp"
    swapped.write_text(SECRET)
    os.replace(swapped, path)
    with (
        pytest.raises(SandboxError, match="not the file the conductor checked"),
        Sandbox(
            prepared.path,
            handler=lambda name, kwargs: None,
            workdir_root=tmp_path / "work",
            context_index=prepared.index_path,
        ) as box,
    ):
        assert "not-for-the-model" not in box.execute("print(context[:200])").stdout


def test_it_fails_a_run_whose_context_was_swapped_after_it_was_checked(
    venues, context_root: Path, secret: Path
) -> None:
    path = context_root / "notes.txt"
    path.write_text("The launch window opens on Tuesday.\n")
    with transaction.atomic():
        run = create(path, scripted("FINAL(context[:200])"))
        path.unlink()
        path.symlink_to(secret)
        run_launch(run)
    run = finish(run)
    assert run.status == "failed" and run.error.startswith("context:"), run.error
    assert "outside the folders" in run.error
    assert "not-for-the-model" not in run.answer


def test_it_keeps_the_launchers_form_and_says_why(venues) -> None:
    client = Client()
    client.force_login(make_user("ops", staff=True))
    form = launcher_form(
        question="What is in it?",
        context_source="path",
        context_path="/etc/shadow",
        task_tokens="1000",
    )
    response = client.post("/runs/new", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "outside the folders" in errors["context_path"][0]
    assert 'value="/etc/shadow"' in response.content.decode()
    assert not Run.objects.exists()


def test_the_command_refuses_in_one_line_before_any_run_exists(venues, subprocess_env) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "frlm_run", "--question", "q", "--context", "/etc/shadow"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("CommandError: --context: context path '/etc/shadow' is outside")
    assert "FRLM_CONTEXT_ROOTS" in line
    assert not Run.objects.exists()


def test_the_gateway_still_serves_fragments_of_the_runs_context_only(
    context_root: Path, secret: Path
) -> None:
    from workers.gateway.fill import filled

    own = context_root / "notes.txt"
    own.write_text("The launch window opens on Tuesday.\n")
    link = context_root / "link.txt"
    link.symlink_to(secret)

    def job(path: Path | str) -> dict:
        ref = {"path": str(path), "chars": [0, 8], "bytes": [0, 8], "sha256": "0" * 64}
        return {"run_id": "rgate", "prompt": f"read <<frlm:fragment {json.dumps(ref)}>>"}

    def run_context(run_id: str) -> str:
        return str(own)

    for path in ("/etc/shadow", secret, link):
        assert "not a context of run rgate" in filled(job(path), run_context)["error"]
    # The run's own file is served (its bytes must still match their sha256).
    assert "do not match their sha256" in filled(job(own), run_context)["error"]


def test_a_child_rlm_over_a_fragment_of_a_changed_context_is_refused_and_its_span_ended(
    venues, context_root: Path
) -> None:
    """rlm_query(context=fragment) checks the fragment as it copies it for the child. The
    copy's refusal left the call's Submit span open for good: it was made before the span's
    try (found while reviewing the copy)."""
    from tests.helpers import trace, wait_until
    from traces import store

    path = context_root / "notes.txt"
    path.write_text("The launch window opens on Tuesday.\n" * 20)
    cell = (
        "f = context.fragment(0, 20)\n"
        "f.sha256\n"
        "import time\n"
        "time.sleep(4)\n"
        "try:\n"
        "    FINAL('answered: ' + rlm_query('q', context=f))\n"
        "except RuntimeError as exc:\n"
        "    FINAL('refused: ' + str(exc))\n"
    )
    with transaction.atomic():
        run = create(path, scripted(cell))
        run_launch(run)
    wait_until(
        lambda: any(e["name"] == "Repl.Exec" for e in store.read_events(run.id)),
        timeout=60,
        what="the cell to start",
    )
    with open(path, "r+b") as handle:  # the same file, changed in place
        handle.write(b"THE")
    run = finish(run)
    assert run.status == "succeeded", run.error
    assert run.answer.startswith("refused: ") and "changed" in run.answer, run.answer
    events = trace(run)
    ended = {e["span_id"] for e in events if e["phase"] == "end"}
    open_ = [e["name"] for e in events if e["phase"] == "start" and e["span_id"] not in ended]
    assert not open_, open_


def test_a_folder_says_what_it_leaves_out_and_keeps_bytes_that_are_not_utf8(
    local, settings, context_root: Path
) -> None:
    """A folder run dropped files without a word (the one holding the answer among them),
    and the joined file turned latin-1 bytes into U+FFFD, so the trace said the context
    was all UTF-8 (a review)."""
    from runs.services import folder_note

    settings.FRLM_CONTEXT_ROOTS = [context_root]
    folder, elsewhere = context_root / "mix", context_root / "other"
    folder.mkdir()
    elsewhere.mkdir()
    (elsewhere / "far.txt").write_text("far\n")
    (folder / "good.txt").write_text("The launch window opens on Tuesday.\n")
    (folder / "latin1.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    (folder / "nul.txt").write_bytes(b"The secret code is 4242.\x00\n")
    (folder / "favicon.svg").write_text("<svg/>")
    (folder / "empty.txt").write_text("")
    (folder / ".hidden.txt").write_text("hidden\n")
    (folder / "linked").symlink_to(elsewhere)
    prepared = context_prepare("rfolder", folder)
    assert [p.name for p in prepared.folder.files] == ["good.txt", "latin1.txt"]
    assert prepared.folder.left_out == [
        ("linked", "a link to a folder, not followed"),
        ("empty.txt", "empty"),
        ("favicon.svg", "not a text file's name (.svg)"),
        ("nul.txt", "binary: it holds NUL bytes"),
    ]
    assert prepared.folder.hidden == 1  # counted, never named (".env", ".git")
    assert prepared.encoding == {"invalid_bytes": 1, "first_invalid_byte": prepared.encoding[
        "first_invalid_byte"]}  # fmt: skip
    assert b"caf\xe9 au lait" in prepared.path.read_bytes()
    run = create(folder)
    assert folder_note(run) == (
        f"context folder {folder}: 2 file(s) joined; 4 left out: linked (a link to a folder, "
        "not followed), empty.txt (empty), favicon.svg (not a text file's name (.svg)), "
        "nul.txt (binary: it holds NUL bytes); 1 hidden file(s) or folder(s) left out"
    )


def test_the_launcher_refuses_an_upload_holding_nul_bytes_in_the_form(venues) -> None:
    """Taken, such an upload failed its run at once with "context file '/…/var/contexts/
    r….txt' is binary", naming the server's copy (a review)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = Client()
    client.force_login(make_user("researcher"))
    upload = SimpleUploadedFile("nul.txt", b"The secret code is 4242.\x00\n", "text/plain")
    form = launcher_form(question="What is the code?", context_source="upload", context_file=upload)
    response = client.post("/runs/new", form)
    assert response.status_code == 400
    (error,) = response.context["form"].errors["context_file"]
    assert error == "the file holds NUL bytes, so it is binary, not text; upload a text file"
    assert not Run.objects.exists()


def test_a_folder_of_many_files_left_out_names_the_first_and_counts_the_rest(
    settings, context_root: Path
) -> None:
    from runs.engine.context import LEFT_OUT_KEPT, scan_folder

    settings.FRLM_CONTEXT_ROOTS = [context_root]
    folder = context_root / "pictures"
    folder.mkdir()
    (folder / "readme.txt").write_text("Pictures of the launch.\n")
    for n in range(LEFT_OUT_KEPT + 100):
        (folder / f"p{n:04d}.png").write_bytes(b"\x89PNG")
    scan = scan_folder(folder, [context_root])
    assert (len(scan.left_out), scan.left_out_count) == (LEFT_OUT_KEPT, LEFT_OUT_KEPT + 100)
    assert scan.note().endswith(
        f"p0005.png (not a text file's name (.png)) and {LEFT_OUT_KEPT + 94} more"
    )


def test_a_users_path_never_reads_the_stores_copies_of_other_runs_contexts(
    local, settings, tmp_path: Path
) -> None:
    """The context store is the default root: a staff user's "path on the server" of it read
    every run's stored context, other users' uploads among them, and its run then wrote a
    copy of all of it there for the next one to read twice (a review). A user's path never
    reads those copies or their indexes; a run reads its own (an upload, a replay's)."""
    from runs.engine import context as ctx

    store = tmp_path / "store"
    settings.FRLM_CONTEXT_DIR = store
    settings.FRLM_CONTEXT_ROOTS = [store]
    copy = ctx.write_text("r0123456789ab", "Someone else's upload: the code is 4417.\n")
    index = ctx.index_file(copy)
    index.write_text("{}")
    notes = store / "notes.txt"
    notes.write_text("The launch window opens on Tuesday.\n")
    for path in (copy, index):
        assert "FRLM's own copy of a run's context" in refusal(path), path
    # The store as a folder: the user's own file only, and what it leaves out is said.
    run = create(store)
    scan = ctx.scan_folder(Path(run.context_path), ctx.context_roots())
    assert scan.files == [notes.resolve()] or scan.files == [notes]
    assert ("r0123456789ab.txt", "FRLM's own copy of a run's context") in scan.left_out
    assert ("index", "FRLM's offset indexes of stored contexts") in scan.left_out
    # The product still reads its own copy, as the run it belongs to does.
    written = ctx.context_roots(written_here=True)
    assert check_path(str(copy), written) == copy.resolve()
