"""frlm_worker's enrolment token from the environment: on its command line every user of the
machine saw it in `ps` (a federation review)."""

from __future__ import annotations

from workers.management.commands.frlm_worker import Command


def test_the_token_may_come_from_the_environment_and_the_flag_wins(monkeypatch):
    monkeypatch.setenv("FRLM_ENROLMENT_TOKEN", "frlmt_from_env")
    parser = Command().create_parser("manage.py", "frlm_worker")
    assert (
        parser.parse_args(["--venue", "edge", "--server", "http://10.0.0.5:8000"]).token
        == "frlmt_from_env"
    )
    given = parser.parse_args(
        ["--venue", "edge", "--server", "http://10.0.0.5:8000", "--token", "frlmt_flag"]
    )
    assert given.token == "frlmt_flag"
    monkeypatch.delenv("FRLM_ENROLMENT_TOKEN")
    assert (
        Command().create_parser("manage.py", "frlm_worker").parse_args(["--venue", "edge"]).token
        is None
    )


def test_make_up_names_the_console_where_the_web_server_listens(monkeypatch):
    """With FRLM_WEB_HOST=10.77.0.1 it said http://127.0.0.1:PORT/, which refused."""
    from frlm_web.management.commands.frlm_up import console_host

    for host, said in (("10.77.0.1", "10.77.0.1"), ("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1")):
        monkeypatch.setenv("FRLM_WEB_HOST", host)
        assert console_host() == said
