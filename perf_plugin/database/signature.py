"""Signatures: how a measurement finds its database row.

A signature is built from ``Input Shapes, Input Data Types, Input Formats, Output Shapes,
Output Data Types`` after normalisation, so that the same kernel written by different tools or
profiler generations compares equal:

* dtype/format spellings: ``DT_BF16`` == ``BF16``, ``FORMAT_ND`` == ``ND``, ``DT_UNDEFINED`` /
  ``NULL`` == empty;
* a dtype/format is blanked where its shape slot is empty, then trailing empty slots are trimmed.

A kernel type may add a rule of its own (``SignatureRule``), declared beside its replay
(``perf_plugin.replay``): the MatMul family (``MatMulV2``, ``MatMulV3``, ``MatMulCommon``)
compares its two operands in the canonical ``M,K;N,K`` form whatever transposition the row was
recorded with; ``Slice`` and ``Transpose`` count input slot 0 only (offsets, sizes and
permutations are host values whose representation differs between tools);
``DispatchFFNCombine`` adds the ``EP Size`` column.  Callers take the rules from the kernel
catalog (``perf_plugin.replay.registry.signature_of``), so every reader of a database compares
rows the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from perf_plugin.database.schema import DETAIL_COLUMNS
from perf_plugin.database.shapes import parse_shape_cell, split_slots

_EMPTY_TOKENS = frozenset({"", "DT_UNDEFINED", "UNDEFINED", "NULL", "N/A"})


def normalise_dtype(token: str) -> str:
    token = token.strip().upper()
    if token in _EMPTY_TOKENS:
        return ""
    if token.startswith("DT_"):
        token = token[3:]
    return sys.intern(token)  # every row repeats a few dtypes: one object each, not one per cell


def normalise_format(token: str) -> str:
    token = token.strip().upper()
    if token in _EMPTY_TOKENS:
        return ""
    if token.startswith("FORMAT_"):
        token = token[7:]
    return sys.intern(token)


@dataclass(frozen=True)
class SignatureRule:
    """What a kernel type's rows compare beyond the plain normalised identity cells."""

    canonical_matmul: bool = False  # the two operands as ``M,K;N,K``, whatever their stored layout
    input_slots: int | None = None  # only the first N input slots count (host-value slots after them)
    extra_columns: tuple[str, ...] = ()  # columns beyond the identity cells that tell rows apart


PLAIN = SignatureRule()


@dataclass(frozen=True)
class Signature:
    input_shapes: tuple[str, ...]
    input_dtypes: tuple[str, ...]
    input_formats: tuple[str, ...]
    output_shapes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    extra: tuple[str, ...] = ()
    details: tuple[str, ...] = ()  # non-empty detail cells (``DETAIL_COLUMNS``): strides, arguments


def _align(shapes: list[str], *others: list[str]) -> list[list[str]]:
    width = max([len(shapes)] + [len(o) for o in others])
    columns = [shapes + [""] * (width - len(shapes))]
    columns += [o + [""] * (width - len(o)) for o in others]
    for i in range(width):
        if columns[0][i].strip() == "":
            for column in columns[1:]:
                column[i] = ""
    while width and all(column[width - 1] == "" for column in columns):
        width -= 1
    return [column[:width] for column in columns]


def _shape_token(slot: str) -> str:
    return ",".join(d.strip() for d in slot.split(",")) if slot.strip() else ""


def _canonical_matmul(in_shapes: list[str], out_shapes: list[str]) -> list[str]:
    """Rewrite the two operand shapes to ``M,K`` and ``N,K`` using the output ``M,N``."""
    try:
        a, b = parse_shape_cell(in_shapes[0])[0], parse_shape_cell(in_shapes[1])[0]
        out = parse_shape_cell(out_shapes[0])[0]
    except Exception:  # malformed rows keep their raw form; the case builder reports them
        return in_shapes
    if a is None or b is None or out is None or len(a) != 2 or len(b) != 2 or len(out) != 2:
        return in_shapes
    m, n = out
    if a[0] == m:
        k = a[1]
    elif a[1] == m:
        k = a[0]
    else:
        return in_shapes
    if b == (k, n):
        b_canon = (n, k)
    elif b == (n, k):
        b_canon = b
    else:
        return in_shapes
    return [f"{m},{k}", f"{b_canon[0]},{b_canon[1]}"] + in_shapes[2:]


def row_signature(row: Mapping[str, str], rule: SignatureRule = PLAIN) -> Signature:
    """The signature of a row's cells under its kernel type's rule."""
    in_shapes = [_shape_token(s) for s in split_slots(row.get("Input Shapes", ""))]
    in_dtypes = [normalise_dtype(t) for t in split_slots(row.get("Input Data Types", ""))]
    in_formats = [normalise_format(t) for t in split_slots(row.get("Input Formats", ""))]
    out_shapes = [_shape_token(s) for s in split_slots(row.get("Output Shapes", ""))]
    out_dtypes = [normalise_dtype(t) for t in split_slots(row.get("Output Data Types", ""))]

    in_shapes, in_dtypes, in_formats = _align(in_shapes, in_dtypes, in_formats)
    out_shapes, out_dtypes = _align(out_shapes, out_dtypes)

    if rule.canonical_matmul and len(in_shapes) >= 2 and out_shapes:
        in_shapes = _canonical_matmul(in_shapes, out_shapes)
    if rule.input_slots is not None:
        count = rule.input_slots
        in_shapes, in_dtypes, in_formats = in_shapes[:count], in_dtypes[:count], in_formats[:count]

    extra = tuple(row.get(name, "").strip() for name in rule.extra_columns)
    details = tuple(f"{name}={value}" for name in DETAIL_COLUMNS if (value := row.get(name, "").strip()))
    return Signature(
        tuple(in_shapes), tuple(in_dtypes), tuple(in_formats), tuple(out_shapes), tuple(out_dtypes), extra, details
    )


def signature_text(signature: Signature) -> str:
    """A readable one-line form, for reports."""
    parts = [
        ";".join(signature.input_shapes),
        ";".join(signature.input_dtypes),
        ";".join(signature.input_formats),
        ";".join(signature.output_shapes),
        ";".join(signature.output_dtypes),
    ]
    text = " | ".join(parts)
    if signature.extra:
        text = f"{text} | {';'.join(signature.extra)}"
    return f"{text} | {' | '.join(signature.details)}" if signature.details else text
