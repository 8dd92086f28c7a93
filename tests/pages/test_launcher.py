"""The run launcher form: a valid form starts a run and opens its page; bad input comes
back with each error beside its field."""

from __future__ import annotations

import re

from django.test import Client

from runs.models import Run
from tests.helpers import finish
from tests.pages.helpers import TASK_FORM, plot_updates, shot, wait_for


def test_it_launches_a_generated_task_and_opens_its_page(page, web):
    page.goto("/runs/new")
    shot(page, "03-launcher")
    # Every default is one the browser takes (the tokens' step held 100,000 invalid).
    invalid = page.evaluate(
        "[...document.querySelectorAll('form input')].filter(i => !i.checkValidity()"
        " && i.value !== '').map(i => i.name)"
    )
    assert invalid == [], invalid
    page.check("input[name=context_source][value=task]")
    page.select_option("#id_task_name", "sniah")
    page.fill("#id_task_tokens", "120000")
    page.fill("#id_task_seed", "5")
    page.check("input[name=venues][value=local]")
    page.check("input[name=venues][value=edge]")
    page.fill("#id_quorum", "1")
    page.fill("#id_max_batch", "64")
    page.click("#launch")
    page.wait_for_url(re.compile(r".*/runs/r[0-9a-f]+$"))
    run_id = page.url.rsplit("/", 1)[1]
    run = Run.objects.get(id=run_id)
    assert run.owner.username == "ops"
    assert run.venues == ["edge", "local"] or sorted(run.venues) == ["edge", "local"]
    assert run.policy["max_batch"] == 64 and run.task["seed"] == 5
    finish(run)
    assert run.status == "succeeded", run.error
    # The page follows the run to its end: the answer, and the trace in every view.
    page.wait_for_function(
        "(a) => document.getElementById('run-answer').textContent.includes(a)", arg=run.answer
    )
    wait_for(page, "document.getElementById('run-header').dataset.done === '1'")
    wait_for(page, "window.frlmMovie.trace.done && window.frlmMovie.rows.length > 10")
    wait_for(page, "Number(document.getElementById('movie').dataset.viewsDrawn) >= 1")
    updates = plot_updates(page)
    assert set(updates) == {"pulse", "fill", "flow", "heat", "topology"}
    assert all(n >= 1 for n in updates.values()), updates
    # The turns are fetched from the stored trace, which may lag the live one a little.
    page.wait_for_selector("#turns pre.code")


def test_it_shows_each_error_beside_its_field(page, web):
    page.goto("/runs/new")
    page.check("input[name=context_source][value=path]")
    page.fill("#id_context_path", "/no/such/corpus.txt")
    page.fill("#id_question", "")
    page.fill("#id_quorum", "7")
    page.click("#launch")
    page.wait_for_selector(".field-errors")
    assert "question is empty" in page.inner_text("#field-question .field-errors")
    # Outside FRLM_CONTEXT_ROOTS: refused for that, before anything is said of the file.
    assert "outside the folders" in page.inner_text("#field-context_path .field-errors")
    assert "policy.quorum must be between 0.05 and 1.0" in page.inner_text(
        "#field-quorum .field-errors"
    )
    # What was typed is kept, and nothing was started.
    assert page.input_value("#id_context_path") == "/no/such/corpus.txt"
    assert not Run.objects.exists()
    shot(page, "04-launcher-errors")

    page.check("input[name=context_source][value=upload]")
    page.fill("#id_question", "What is in it?")
    page.fill("#id_quorum", "0.5")
    page.click("#launch")
    page.wait_for_selector("#field-context_file .field-errors")
    assert "choose a text file" in page.inner_text("#field-context_file .field-errors")

    page.check(
        "input[name=venues][value=local]",
    )
    page.uncheck("input[name=venues][value=local]")
    page.uncheck("input[name=venues][value=edge]")
    page.check("input[name=context_source][value=task]")
    page.click("#launch")
    page.wait_for_selector("#field-venues .field-errors")
    assert "at least one venue" in page.inner_text("#field-venues .field-errors")
    assert not Run.objects.exists()


def test_it_shows_every_error_in_one_submission(page, web):
    """A field the form itself refused (too few tokens, no file chosen) held the policy's
    checks back: the quorum, the turns and the budget were said to be wrong only once
    that was fixed and the form sent again (a review)."""
    page.goto("/runs/new")
    page.check("input[name=context_source][value=task]")
    page.fill("#id_task_tokens", "50")
    page.fill("#id_task_seed", "-1")
    for field, value in (("quorum", "5"), ("max_turns", "0"), ("budget_usd", "-3")):
        page.fill(f"#id_{field}", value)
    page.click("#launch")
    page.wait_for_selector(".field-errors")
    assert "tokens must be between 100 and" in page.inner_text("#field-task_tokens .field-errors")
    assert f"seed must be from 0 to {2**63 - 1}, not -1" in page.inner_text(
        "#field-task_seed .field-errors"
    )
    for field in ("quorum", "max_turns", "budget_usd"):
        assert f"policy.{field} must be between" in page.inner_text(f"#field-{field} .field-errors")
    assert page.input_value("#id_quorum") == "5"

    page.check("input[name=context_source][value=upload]")
    page.click("#launch")
    page.wait_for_selector("#field-context_file .field-errors")
    assert "choose a text file" in page.inner_text("#field-context_file .field-errors")
    assert "policy.quorum must be between" in page.inner_text("#field-quorum .field-errors")
    assert not Run.objects.exists()


def test_it_reads_an_uploaded_context(page, web, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The launch window opens at 06:40 on the ninth.\n" * 50)
    page.goto("/runs/new")
    page.check("input[name=context_source][value=upload]")
    page.set_input_files("#id_context_file", str(notes))
    page.fill("#id_question", "When does the launch window open?")
    page.click("#launch")
    page.wait_for_url(re.compile(r".*/runs/r[0-9a-f]+$"))
    run = Run.objects.get(id=page.url.rsplit("/", 1)[1])
    assert run.context_source == "text" and run.context_chars == len(notes.read_text())
    finish(run)
    assert run.status == "succeeded", run.error


def test_it_offers_only_configured_endpoints(page, web, staff, settings):
    """The conductor sends the server's API key to a run's endpoint: a user chooses among
    the configured ones and cannot name a URL of their own."""
    page.goto("/runs/new")
    page.select_option("#id_root_kind", "openai")
    assert page.locator("#id_root_endpoint").is_visible()
    options = page.locator("#id_root_endpoint option").evaluate_all(
        "os => os.map(o => o.value).filter(Boolean)"
    )
    assert options == list(settings.FRLM_ENDPOINTS)
    assert page.locator("input[name=root_base_url], input[type=url]").count() == 0
    # A forged choice, or a URL sent in place of one, is refused beside the field.
    client = Client()
    client.force_login(staff)
    form = {
        **TASK_FORM,
        "root_kind": "openai",
        "root_endpoint": "http://attacker.example/v1",
        "root_model": "gpt",
    }
    response = client.post("/runs/new", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "root_endpoint" in errors and "valid choice" in errors["root_endpoint"][0]
    assert not Run.objects.exists()


def test_it_refuses_a_question_longer_than_a_question_may_be(staff, venues):
    """A 2,000,000-character question was taken (a review), and its run page never finished
    loading in Chromium: the form refuses it beside the field, keeps it, starts nothing."""
    client = Client()
    client.force_login(staff)
    long = "A" * 100_001
    form = {**TASK_FORM, "question": long}
    response = client.post("/runs/new", form)
    assert response.status_code == 400
    (error,) = response.context["form"].errors["question"]
    assert "100,001 characters, more than the 100,000 a question may have" in error
    assert "put long material in the context" in error
    assert response.context["form"]["question"].value() == long
    assert not Run.objects.exists()


def test_a_task_out_of_range_is_said_beside_a_field_the_form_refused(staff, venues):
    """With a field the form itself refused (a quorum that is not a number), a token count
    out of range was said only once that was fixed (a review)."""
    client = Client()
    client.force_login(staff)
    form = {
        **TASK_FORM,
        "question": "",
        "quorum": "half",
        "task_tokens": str(10**21),
        "task_seed": "",
    }
    response = client.post("/runs/new", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "quorum" in errors
    assert "tokens must be between 100 and" in errors["task_tokens"][0], errors
    assert not Run.objects.exists()


def test_it_takes_the_verification_tier_hedging_and_a_budget(page, web):
    page.goto("/runs/new")
    page.fill("#id_budget_usd", "-1")
    page.click("#launch")
    page.wait_for_selector("#field-budget_usd .field-errors")
    assert "policy.budget_usd must be between 0.0 and 1000000.0" in page.inner_text(
        "#field-budget_usd .field-errors"
    )
    assert not Run.objects.exists()

    page.check("input[name=context_source][value=task]")
    page.select_option("#id_task_name", "sniah")
    page.fill("#id_task_tokens", "60000")
    page.check("input[name=venues][value=local]")
    page.check("input[name=venues][value=edge]")
    page.select_option("#id_tier", "redundant")
    page.select_option("#id_hedge", "off")
    page.fill("#id_budget_usd", "0.5")
    page.click("#launch")
    page.wait_for_url(re.compile(r".*/runs/r[0-9a-f]+$"))
    run = finish(Run.objects.get(id=page.url.rsplit("/", 1)[1]))
    assert run.policy["tier"] == "redundant" and run.policy["hedge"] == "off"
    assert run.policy["budget_usd"] == 0.5
    assert run.status == "succeeded", run.error
    # The tier checked: the edge worker, new, got a known-answer probe, and any answer of
    # it was copied; the trusted local venue's answers are sampled at 2% only.
    assert sum(run.accounts["verification"]["by_kind"].values()) > 0
    assert run.accounts["budget"]["run"]["cap"] == "0.5"  # exact: a decimal string


def test_it_says_what_is_wrong_with_a_context_source_and_asks_for_the_file_again(staff, venues):
    """A tampered context_source got a 400 with no word beside it; after any error an
    uploaded file is gone, and nothing said to choose it again (a review)."""
    client = Client()
    client.force_login(staff)
    response = client.post("/runs/new", {**TASK_FORM, "context_source": "zzz"})
    assert response.status_code == 400
    html = response.content.decode()
    (error,) = response.context["form"].errors["context_source"]
    assert error in html.replace("&#x27;", "'")
    response = client.post("/runs/new", {**TASK_FORM, "context_source": "upload"})
    assert response.status_code == 400
    assert 'id="upload-again"' in response.content.decode()
    assert not Run.objects.exists()


def test_a_file_over_the_upload_limit_is_refused_before_it_is_sent(page, web, tmp_path):
    """The web server answers a body over its limit with a bare 413: the form and all it
    held were gone (a review). The page says the limit, and refuses such a file itself."""
    from runs.forms import UPLOAD_MAX_BYTES

    big = tmp_path / "big.txt"
    with big.open("wb") as out:  # sparse: nothing is written but its size
        out.truncate(UPLOAD_MAX_BYTES + 1)
    page.goto("/runs/new")
    page.check("input[name=context_source][value=upload]")
    assert f"at most {UPLOAD_MAX_BYTES // 2**20} MB" in page.inner_text("#field-context_file")
    page.fill("#id_question", "What is in it?")
    page.fill("#id_quorum", "0.5")
    page.set_input_files("#id_context_file", str(big))
    said = page.inner_text("#field-context_file .field-errors")
    assert f"the file is {UPLOAD_MAX_BYTES + 1:,} bytes; upload at most" in said
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    page.click("#launch")
    page.wait_for_load_state("networkidle")
    assert not posted, posted  # nothing sent: the page is still the one filled in
    assert page.input_value("#id_question") == "What is in it?"
    assert page.input_value("#id_quorum") == "0.5"
    assert not Run.objects.exists()
    # Another context picked with the file still chosen: the file is not sent (it went in
    # the body, and the server's 413 lost the form all the same; a review).
    page.check("input[name=context_source][value=task]")
    page.fill("#id_question", "")
    page.click("#launch")
    page.wait_for_url(re.compile(r".*/runs/r[0-9a-f]+$"))
    finish(Run.objects.get())
