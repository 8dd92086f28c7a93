"""Aligning the children of two condensed nodes: siblings with one key are matched by a
longest common subsequence, and the unmatched of both sides are placed between the matches
by their time from their own run's start."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from traces.diff.condense import Node


def lcs_pairs(a_keys: list[str], b_keys: list[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of two key lists. Condensed siblings
    have unique keys, so the LCS is the longest increasing run of B positions taken in A's
    order: patience sorting finds it in n log n, where the usual table costs n * m (a batch
    of distinct prompts gives thousands of siblings)."""
    where = {key: j for j, key in enumerate(b_keys)}
    seq = [(i, where[key]) for i, key in enumerate(a_keys) if key in where]
    tails: list[int] = []  # tails[k]: the least B position ending a run of length k + 1
    ends: list[int] = []  # ends[k]: index in seq of that run's last element
    before = [-1] * len(seq)
    for idx, (_, j) in enumerate(seq):
        k = bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            ends.append(idx)
        else:
            tails[k] = j
            ends[k] = idx
        before[idx] = ends[k - 1] if k else -1
    out: list[tuple[int, int]] = []
    idx = ends[-1] if ends else -1
    while idx >= 0:
        out.append(seq[idx])
        idx = before[idx]
    return out[::-1]


Pairing = tuple[Node | None, Node | None]


def offset_ms(ns: int | None, origin: int) -> float | None:
    return None if ns is None else round((ns - origin) / 1e6, 3)


@dataclass(frozen=True)
class Clock:
    """Where each run started: a node is placed by its offset from its own run's start."""

    origin_a: int
    origin_b: int

    def offset_a(self, node: Node | None) -> float | None:
        return offset_ms(node.first_ns if node else None, self.origin_a)

    def offset_b(self, node: Node | None) -> float | None:
        return offset_ms(node.first_ns if node else None, self.origin_b)


def align(a: list[Node], b: list[Node], clock: Clock) -> list[Pairing]:
    """Matched siblings in order; between two matches, the unmatched of both sides
    interleaved by their offset from their own run's start."""
    out: list[Pairing] = []
    i = j = 0
    for mi, mj in [*lcs_pairs([n.key for n in a], [n.key for n in b]), (len(a), len(b))]:
        loose = [(clock.offset_a(n), 0, n) for n in a[i:mi]]
        loose += [(clock.offset_b(n), 1, n) for n in b[j:mj]]
        loose.sort(key=lambda t: (float("inf") if t[0] is None else t[0], t[1]))
        out.extend((n, None) if side == 0 else (None, n) for _, side, n in loose)
        if mi < len(a):
            out.append((a[mi], b[mj]))
        i, j = mi + 1, mj + 1
    return out
