"""Which workers a suite's federation made dishonest, as the report's Table 4 counts them."""

from __future__ import annotations

from runs.experiments.measures import dishonest_workers
from runs.experiments.suite import load_suite
from workers.swarm import devices, profile_load


def test_it_draws_the_liars_and_colluders_the_swarms_of_the_default_suite_start(tmp_path):
    found = dishonest_workers(load_suite("default").to_dict())
    assert {n for n, k in found.items() if k == "colluding"} == {
        "xp-colluders-xp-colluders-1",
        "xp-colluders-xp-colluders-2",
    }
    liars = [n for n, k in found.items() if k == "lying"]
    assert len(liars) == 1 and liars[0].startswith("xp-edge-xp-edge-")
    # Named as the runner's swarms name their devices (runs.experiments.federation).
    from runs.experiments.federation import venue_specs
    from runs.experiments.suite import load_suite as again

    specs = venue_specs(again("default"), tmp_path / "profiles")
    edge = next(s for s in specs if s.name == "xp-edge")
    drawn = devices(profile_load(edge.swarm), "xp-edge", 4, 0)
    assert liars == [d.name for d in drawn if d.liar]
    # The trusted datacenter venues lie nowhere.
    assert not [n for n in found if n.startswith(("xp-local", "xp-dc"))]


def test_it_reads_the_profile_file_the_runner_wrote_in_the_output_folder(tmp_path):
    suite = load_suite("small").to_dict()
    from runs.experiments.federation import venue_specs
    from runs.experiments.suite import load_suite as again

    venue_specs(again("small"), tmp_path / "profiles")
    found = dishonest_workers(suite, tmp_path)
    assert found == dishonest_workers(suite)  # the same names, read or drawn again
    # An older output folder, whose swarm's profile file had another name.
    (tmp_path / "profiles" / "xp-edge.toml").rename(tmp_path / "profile.toml")
    (tmp_path / "profiles" / "xp-edge").mkdir()
    (tmp_path / "profile.toml").rename(tmp_path / "profiles" / "xp-edge" / "profile.toml")
    assert all(n.startswith("xp-edge-profile-") for n in dishonest_workers(suite, tmp_path))


def test_it_takes_a_profile_file_and_explicit_lists(tmp_path):
    liars = profile_load("liars")
    drawn = {d.name for d in devices(liars, "mob", 10, 0) if d.liar}
    suite = {"federation": {"venues": [{"name": "mob", "workers": 10, "profile": "liars"}]}}
    assert set(dishonest_workers(suite)) == drawn and len(drawn) == 3
    listed = {"federation": {"venues": [{"name": "x", "liars": ["a"], "colluders": ["b"]}]}}
    assert dishonest_workers(listed) == {"a": "lying", "b": "colluding"}
    assert dishonest_workers({"federation": {}}) == {}
