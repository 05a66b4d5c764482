"""Shape relations of data-movement rows: which permutation, gather axis or concatenation axis
turns a row's input shapes into its output shape (None where none does)."""

from __future__ import annotations

from collections.abc import Sequence

Shape = tuple[int, ...]


def derive_perm(source: Shape, target: Shape) -> tuple[int, ...] | None:
    """The lexicographically first permutation ``p`` with ``source[p[i]] == target[i]``."""
    if len(source) != len(target) or sorted(source) != sorted(target):
        return None
    used: set[int] = set()
    perm: list[int] = []
    for size in target:
        # taking the smallest free axis of the right size at each position is the
        # lexicographically smallest choice, and it never blocks a later position
        axis = next(a for a in range(len(source)) if a not in used and source[a] == size)
        used.add(axis)
        perm.append(axis)
    return tuple(perm)


def gather_axis(table: Shape, indices: Shape, out: Shape) -> int | None:
    """The first axis along which gathering ``indices`` from ``table`` gives ``out``."""
    for axis in range(len(table)):
        if table[:axis] + indices + table[axis + 1 :] == out:
            return axis
    return None


def concat_axis(inputs: Sequence[Shape], out: Shape) -> int | None:
    """The first axis along which ``inputs`` concatenate into ``out``."""
    if any(len(s) != len(out) for s in inputs):
        return None
    for axis in range(len(out)):
        rest = out[:axis] + out[axis + 1 :]
        others_match = all(s[:axis] + s[axis + 1 :] == rest for s in inputs)
        if others_match and sum(s[axis] for s in inputs) == out[axis]:
            return axis
    return None
