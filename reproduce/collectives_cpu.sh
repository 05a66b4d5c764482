#!/usr/bin/env bash
# Runs the single-node collective benchmarks of docs/collectives.md and docs/running.md on the CPU
# (gloo), word for word, in a copy of this checkout (so the hcom_*.csv files they write land in the
# copy's database/data/CPU_X86_64/gloo/<torch version>, not this checkout's), then compares the
# two runs' files with perfdb validate-comm. Writes OUTDIR/collectives_cpu.json: each step's exit
# status and seconds, and the files each run wrote.
#
#   . .venv/bin/activate && bash reproduce/collectives_cpu.sh OUTDIR
#
# 25-40 s a run on a 2-core x86 machine (the default grid: four collectives, 1K..1M, bf16, 2
# ranks). tests/test_docs_commands.py checks that the docs' command is here.
set -uo pipefail

OUT="${1:?usage: bash reproduce/collectives_cpu.sh OUTDIR}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
COPY="$OUT/checkout"
rm -rf "$COPY" && mkdir -p "$COPY"
tar -C "$SRC" --exclude=./.venv --exclude=./.git --exclude='*/reports' --exclude='*/.perf-journal' \
    --exclude='*/__pycache__' --exclude='*.egg-info' --exclude=./.mypy_cache --exclude=./.benchmarks \
    --exclude=./database/data/CPU_X86_64/gloo -cf - . | tar -C "$COPY" -xf -
cd "$COPY" || exit 1
export PERF_BACKEND=cpu  # gloo, whatever accelerator the machine has

results=()
step() {  # $1: name, $2: the command ($0 in it: OUTDIR)
    local name="$1" start rc
    start=$(date +%s)
    bash -c "$2" "$OUT" >"$OUT/$name.log" 2>&1
    rc=$?
    results+=("{\"step\": \"$name\", \"exit_status\": $rc, \"seconds\": $(( $(date +%s) - start )), \"log\": \"$name.log\"}")
    echo "$name: exit $rc ($OUT/$name.log)"
}

# pytest launches torchrun itself (docs/collectives.md)
step comm_nproc 'pytest bench -m comm --comm-nproc 2'
step keep_first 'rm -rf "$0/first" && mkdir -p "$0/first" && cp database/data/CPU_X86_64/gloo/*/hcom_*.csv "$0/first/"'
# under your own torchrun (docs/running.md)
step under_torchrun 'torchrun --nproc-per-node 2 -m pytest bench -m comm'
# the two runs' durations side by side (no --gate: host timings on a shared CPU move by more than 10 %)
step validate 'perfdb validate-comm "$0/first" database/data/CPU_X86_64/gloo/*/ --threshold 0.1 --output "$0/validate_comm.csv"'

files=$(cd database/data && ls -1 CPU_X86_64/gloo/*/hcom_*.csv 2>/dev/null | sed 's/.*/"&"/' | paste -sd, -)
( IFS=,; echo "{\"script\": \"reproduce/collectives_cpu.sh\", \"steps\": [${results[*]}], \"files\": [${files}]}" ) \
    >"$OUT/collectives_cpu.json"
echo "report: $OUT/collectives_cpu.json"
