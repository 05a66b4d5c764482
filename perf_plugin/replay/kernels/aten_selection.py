"""``aten.topk`` and ``aten.sort`` rows: the generic ``torch.ops.aten`` replay, verified as every
correct selection kernel agrees.

Two correct kernels may return different results for the same input: with ``sorted=False`` a
top-k's values come in any order, and where values tie (common in BF16 and in the draws the
generic replay makes) any of the tied positions is a right index.  Positional comparison with
the float64 CPU reference then fails kernels that are right.  So both the replay's outputs and
the reference's are compared in a form every correct kernel agrees on (``comparable``):

* values: a top-k's sorted along its dim (largest first, or smallest); a sort's as returned;
* indices: the input's values at those indices (``x.gather(dim, indices)``), sorted as the
  values are, after checking that no index repeats within a slice; an index out of range or a
  repeat fails the case.

Calls through another overload (``sort.stable`` with keyword arguments, ``topk.values``) are
compared positionally, as the generic replay does.

A top-k row that carries its calls' ``Profiling Selection Depths`` gets its drawn input rebuilt
to them (``perf_plugin.replay.value_draws.with_recorded_depths``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.kernels.aten_ops import AtenOpReplay
from perf_plugin.replay.tensors import KernelRow
from perf_plugin.replay.value_draws import recorded_depths, with_recorded_depths
from perf_plugin.replay.verify import VerificationError

if TYPE_CHECKING:
    import torch


def _argument(template: Sequence[Any], position: int, default: Any) -> Any:
    return template[position] if position < len(template) else default


def _selection(name: str, overload: str, template: Sequence[Any]) -> tuple[int, bool, bool] | None:
    """(dim, order descending, sort the values first) of a call compared by value, else None."""
    if overload not in ("", "default") or not template or not isinstance(template[0], dict):
        return None
    if name == "topk":  # topk(self, k, dim=-1, largest=True, sorted=True)
        return int(_argument(template, 2, -1)), bool(_argument(template, 3, True)), True
    if name == "sort":  # sort(self, dim=-1, descending=False)
        return int(_argument(template, 1, -1)), bool(_argument(template, 2, False)), False
    return None


def _check_distinct(indices: "torch.Tensor", dim: int) -> None:
    ordered = indices.sort(dim=dim).values
    if ordered.shape[dim] > 1 and bool((ordered.diff(dim=dim) == 0).any()):
        raise VerificationError("an index repeats within a slice: not a selection of distinct elements")


class AtenSelectionReplay(AtenOpReplay):
    kernel_types = ("aten.topk", "aten.sort")
    kernel_type_prefixes = ()

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        name, overload, template, tensors, placed = super().make_inputs(row, device, generator)
        selection = _selection(name, overload, template)
        if name != "topk" or selection is None:
            return name, overload, template, tensors, placed
        slot, depths = int(template[0]["tensor"]), recorded_depths(row)
        histogram = depths[slot] if slot < len(depths) else None
        if histogram:
            dim, largest, _ = selection
            rebuilt = with_recorded_depths(tensors[slot], int(template[1]), dim, largest, histogram, generator)
            tensors = (*tensors[:slot], rebuilt, *tensors[slot + 1 :])
        return name, overload, template, tensors, placed

    def comparable(self, args: tuple[Any, ...], outputs: Any) -> Any:
        name, overload, template, tensors, _ = args
        selection = _selection(name, overload, template)
        if selection is None or not isinstance(outputs, tuple) or len(outputs) != 2:
            return outputs
        dim, descending, sort_values = selection
        values, indices = outputs
        return selection_comparable(tensors[int(template[0]["tensor"])], values, indices, dim, descending, sort_values)


def selection_comparable(x: "torch.Tensor", values: "torch.Tensor", indices: "torch.Tensor", dim: int,
                         descending: bool, sort_values: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
    """A selection's (values, indices) of ``x`` along ``dim`` in the form every correct kernel
    agrees on: the values (sorted first where ``sort_values``: a top-k's order is free), and the
    input's values at the indices, sorted as the values are.  Raises VerificationError where an
    index repeats within a slice or does not address ``x``."""
    x = x.to(values.device, values.dtype)
    try:
        _check_distinct(indices, dim)
        picked = x.gather(dim, indices)
    except RuntimeError as exc:  # an index out of range
        raise VerificationError(f"the indices do not address the input: {str(exc).splitlines()[0]}") from None
    if sort_values:
        values = values.sort(dim=dim, descending=descending).values
    return values, picked.sort(dim=dim, descending=descending).values if sort_values else picked
