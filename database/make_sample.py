"""Rebuild the shipped CPU sample database from the real Ascend profiles in tests/fixtures.

The sample holds real shapes: one row per distinct (kernel type, identity columns) among the
kernel types that have a replay, taken from two public torch_npu profiles (see
tests/fixtures/ascend/SOURCES.md).  Rows whose tensors exceed ``MAX_ROW_BYTES`` are left out so
that ``pytest bench`` on the sample finishes in a few minutes on a 2-core CPU.  Only identity
columns are kept (the profiles' durations are Ascend durations, meaningless for a CPU database),
plus ``Row Origin`` naming the source file.

    python database/make_sample.py            # writes database/data/CPU_X86_64/torch/torch2.13.0
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf_plugin.database.paths import shipped_sample_dir  # noqa: E402
from perf_plugin.database.schema import IDENTITY_COLUMNS, ROW_ORIGIN  # noqa: E402
from perf_plugin.database.table import CsvTable  # noqa: E402
from perf_plugin.replay.tensors import kernel_row_from_cells  # noqa: E402

SOURCES = ("kernel_details_level2_llm_train.csv", "kernel_details_level1.csv")
KERNEL_TYPES = (
    "MatMulV2", "MatMulV3", "MatMulCommon", "BatchMatMulV2", "Add", "Mul", "Muls", "Cast", "RmsNorm",
    "SwiGlu", "SoftmaxV2", "Transpose", "Slice", "GatherV2", "TensorMove", "ConcatD",
)
MAX_ROW_BYTES = 400 * 1024 * 1024


def main() -> int:
    fixtures = ROOT / "tests" / "fixtures" / "ascend"
    out_dir = shipped_sample_dir(ROOT / "database" / "data")
    tables: dict[str, CsvTable] = {}
    seen: set[tuple[str, ...]] = set()
    for source in SOURCES:
        table = CsvTable.read(fixtures / source)
        for i in range(len(table)):
            kernel_type = table.get(i, "Type")
            if kernel_type not in KERNEL_TYPES:
                continue
            cells = {c: table.get(i, c) for c in IDENTITY_COLUMNS}
            key = (kernel_type, *cells.values())
            if key in seen:
                continue
            seen.add(key)
            if kernel_row_from_cells(kernel_type, cells).nbytes > MAX_ROW_BYTES:
                continue
            target = tables.setdefault(kernel_type, CsvTable.new([*IDENTITY_COLUMNS, ROW_ORIGIN]))
            target.append_row({**cells, ROW_ORIGIN: f"ascend-profile:{source}"})
    for kernel_type, table in sorted(tables.items()):
        table.write(out_dir / f"{kernel_type}.csv")
        print(f"{kernel_type}: {len(table)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
