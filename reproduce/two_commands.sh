#!/usr/bin/env bash
# Runs README.md's "Two commands", word for word, each in a fresh copy of this checkout (no .venv,
# no .git, no reports), and writes OUTDIR/two_commands.json: each command's exit status and seconds.
#
#   bash reproduce/two_commands.sh OUTDIR
#
# Needs python3 and the package index (pip installs torch==2.13.0 and this package into each
# copy's own .venv). The first command replays the whole shipped sample (CPU: 44-85 s on a 2-core
# x86 machine, docs/measured.md) and writes its durations into the copy's CSVs, not this
# checkout's; the second runs the project's tests. tests/test_docs_commands.py checks that the
# README still shows these two commands and that this script runs them.
set -uo pipefail

OUT="${1:?usage: bash reproduce/two_commands.sh OUTDIR}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

fresh_copy() {  # $1: target directory
    rm -rf "$1" && mkdir -p "$1"
    tar -C "$SRC" --exclude=./.venv --exclude=./.git --exclude='*/reports' --exclude='*/.perf-journal' \
        --exclude='*/__pycache__' --exclude='*.egg-info' --exclude=./.mypy_cache --exclude=./.benchmarks -cf - . | tar -C "$1" -xf -
}

results=()
run() {  # $1: name; the command is the rest of the line, as README.md gives it
    local name="$1" dir="$OUT/$1" start rc
    shift
    fresh_copy "$dir"
    start=$(date +%s)
    ( cd "$dir" && bash -c "$*" ) >"$OUT/$name.log" 2>&1
    rc=$?
    results+=("{\"command\": \"$name\", \"exit_status\": $rc, \"seconds\": $(( $(date +%s) - start )), \"log\": \"$name.log\"}")
    echo "$name: exit $rc ($OUT/$name.log)"
}

# The main job.
run main_job 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && pytest bench'
# The project's tests.
run project_tests 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && pytest tests'

( IFS=,; echo "{\"script\": \"reproduce/two_commands.sh\", \"runs\": [${results[*]}]}" ) >"$OUT/two_commands.json"
echo "report: $OUT/two_commands.json"
