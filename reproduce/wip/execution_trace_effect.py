"""A model's trace ingested and replayed with its execution trace beside it, and again without it.

``benchmarks/model_coverage.py --profile-only`` profiles a model and writes ``trace.json`` with
``trace.et.json`` (the execution trace) and ``trace.values.json`` beside it.  This script replays
that trace twice through the same benchmark (``--traces``): from its folder, where ingest names
each input's tensor by its storage, and from a copy of the folder without the execution trace,
where ingest infers each input's writer from shapes; it prints both reports.  The figures of
docs/coverage.md's "Inputs named by an execution trace" come from it (H200, five models; e.g.
Mistral 97.6 % of the time and 91.5 % of the rows within 10 % without the names, 99.8 % and 97.6 %
with them).

Prerequisites: a CUDA GPU, ``transformers``, this project installed.

    python benchmarks/model_coverage.py --profile-only --models hf:mistral --layers 2 --decode-steps 4 --out OUT
    python reproduce/wip/execution_trace_effect.py --model hf:mistral --out OUT

Expected output: the model's report with the names (``OUT/named``) and without them (``OUT/shapes``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the --models entry model_coverage.py profiled")
    parser.add_argument("--out", required=True, help="the --out folder model_coverage.py --profile-only wrote")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    name = args.model.replace(":", "-")
    profiled = Path(args.out) / name
    for variant, keep_names in (("named", True), ("shapes", False)):
        folder = Path(args.out) / variant / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for file in profiled.glob("trace*.json"):
            if keep_names or not file.name.endswith(".et.json"):
                shutil.copy(file, folder / file.name)
        command = [sys.executable, str(ROOT / "benchmarks" / "model_coverage.py"), "--traces", str(folder / "trace.json"),
                   "--repeats", str(args.repeats), "--cache-modes", "auto", "--out", str(folder.parent)]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
