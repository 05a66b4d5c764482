"""A case's result as the controller keeps it: compact samples that read like the tuple measured."""

from __future__ import annotations

import json
import sys

import pytest

from perf_plugin.results import CaseRef, CaseResult, KernelTime, Samples, SampleStats

REF = CaseRef("Add-8x128", "Add", "Add.csv", 2, "8,128;8,128 | FLOAT;FLOAT")


def test_a_result_carried_as_json_keeps_its_samples_compact_and_equal() -> None:
    measured = CaseResult(REF, "passed", backend="cuda", samples_us=tuple(1.0 + i / 8 for i in range(30)),
                          kernels=(KernelTime("vectorized_elementwise_kernel", 1.2, 1.0),))
    carried = CaseResult.from_json(json.loads(json.dumps(measured.to_json())))
    assert isinstance(carried.samples_us, Samples)
    assert carried == measured  # equal to the tuple it was measured as
    assert carried.samples_us[0] == 1.0 and carried.samples_us[-1] == measured.samples_us[-1]
    assert list(carried.samples_us[1:3]) == [1.125, 1.25]
    assert SampleStats.of(carried.samples_us) == SampleStats.of(measured.samples_us)
    assert CaseResult.from_json(carried.to_json()) == carried
    # 30 samples: one buffer instead of a tuple and 30 float objects
    as_tuple = sys.getsizeof(measured.samples_us) + sum(sys.getsizeof(s) for s in measured.samples_us)
    assert sys.getsizeof(carried.samples_us._values) < as_tuple / 2


def test_samples_differ_from_other_values_and_do_not_hash() -> None:
    samples = Samples([1.0, 2.0])
    assert samples != (1.0, 2.5) and samples != (1.0,) and samples != [1.0, 2.0, 3.0]
    assert samples == [1.0, 2.0] and samples == Samples((1.0, 2.0)) and not Samples()
    assert samples.__eq__("1.0, 2.0") is NotImplemented
    with pytest.raises(TypeError):
        hash(samples)  # equal to tuples, which hash differently
