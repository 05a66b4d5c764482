"""Rebuild ``tests/fixtures/torch_npu/schemas.txt``: the operator schemas a torch-npu wheel registers.

torch-npu registers its operators (``torch.ops.npu.*``, what ``torch_npu.npu_*`` calls) from
schema strings compiled into ``torch_npu/lib/libtorch_npu.so`` and ``libop_plugin_atb.so``.  This
script reads the printable strings of both libraries of a downloaded wheel, keeps those that
parse as schemas (``tests/npu_schemas.py``), and writes them sorted, under a header naming the
wheel, its SHA-256 and the files.  The project's tests bind every NPU call its replays build to
these schemas (``tests/test_npu_schemas.py``).

Prerequisites: the package index (``pip download``), ``unzip``-free (the wheel is read with
zipfile), this project's checkout.

    pip download torch-npu==2.14.0 --no-deps -d /tmp/wheel
    python reproduce/torch_npu_schemas.py /tmp/wheel/torch_npu-2.14.0-*.whl

Expected output: ``N schemas from WHEEL -> tests/fixtures/torch_npu/schemas.txt``.
"""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.npu_schemas import SCHEMAS, parse_schema  # noqa: E402

LIBRARIES = ("torch_npu/lib/libtorch_npu.so", "torch_npu/lib/libop_plugin_atb.so")
PRINTABLE = re.compile(rb"[\x20-\x7e]{8,}")


def schema_strings(wheel: Path) -> list[str]:
    found: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in LIBRARIES:
            for match in PRINTABLE.finditer(archive.read(name)):
                text = match.group().decode()
                if parse_schema(text) is not None:
                    found.add(text)
    return sorted(found)


def main(argv: list[str]) -> int:
    wheel = Path(argv[1])
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    schemas = schema_strings(wheel)
    header = [
        f"# The operator schemas registered by {wheel.name} (pip download torch-npu; sha256 {digest}),",
        f"# read from {' and '.join(LIBRARIES)} by reproduce/torch_npu_schemas.py.",
    ]
    SCHEMAS.write_text("\n".join(header + schemas) + "\n")
    print(f"{len(schemas)} schemas from {wheel.name} -> {SCHEMAS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
