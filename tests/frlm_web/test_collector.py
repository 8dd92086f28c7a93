"""A long-running process freezes what it loaded to start out of the cycle collector's
walks (frlm_web/collector.py), unless FRLM_GC_FREEZE is off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from frlm_web import collector


@pytest.fixture
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_it_freezes_what_the_process_holds_so_a_full_collection_walks_only_what_came_since(
    collector_restored: None,
) -> None:
    loaded = [[i] for i in range(1000)]  # alive when the process settles
    collector.settle()
    walked = {id(o) for o in gc.get_objects()}  # what a collection walks (not the frozen)
    assert gc.get_freeze_count() >= len(loaded)
    assert id(loaded) not in walked and not any(id(item) in walked for item in loaded)
    later = [[i] for i in range(100)]
    walked = {id(o) for o in gc.get_objects()}
    assert id(later) in walked and all(id(item) in walked for item in later)


def test_it_keeps_pythons_threshold_unless_asked(collector_restored: None) -> None:
    before = gc.get_threshold()
    collector.settle()
    assert gc.get_threshold() == before
    collector.settle(threshold=50_000)
    assert gc.get_threshold() == (50_000, *before[1:])


def test_it_leaves_the_collector_alone_when_turned_off(collector_restored: None, settings) -> None:
    settings.FRLM_GC_FREEZE = False
    before = gc.get_freeze_count(), gc.get_threshold()
    collector.settle(threshold=50_000)
    assert (gc.get_freeze_count(), gc.get_threshold()) == before
