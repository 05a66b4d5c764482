#!/usr/bin/env bash
# Architectures the project never profiled on a GPU, profiled and replayed as the issue's models
# are (benchmarks/model_coverage.py, two layers, a 512-token prefill, 4 decode steps, 20 repeats,
# a second profiling process), with the rows out of the band listed by their share of the time.
#
#   bash reproduce/wip/fresh_models_h100.sh OUT_DIR MODEL [MODEL ...]   # e.g. hf:gpt_neox hf:falcon
#
# Prerequisites: a CUDA GPU, transformers, this project installed. Expected output: per model, the
# benchmark's coverage and fidelity lines, then "out of band: X % of replayed time" and its rows.
set -uo pipefail
out=${1:?output directory}; shift
here=$(cd "$(dirname "$0")" && pwd)
for m in "$@"; do
    timeout "${MODEL_SECONDS:-200}" python3 "$here/../../benchmarks/model_coverage.py" --models "$m" --layers 2 \
        --decode-steps 4 --repeats 20 --cache-modes auto --second-process --out "$out/${m//:/-}" 2>&1 \
        | grep -E "coverage|spread|within|Error|error" | grep -v Warning | tail -12
    python3 "$here/out_of_band.py" "$out/${m//:/-}" || true
done
