#!/usr/bin/env bash
# The CUDA measurements README.md reports, on one machine with an NVIDIA GPU and torch built for it.
#
#   bash tests/perf/cuda_evidence.sh OUTDIR [STEP ...]
#
# STEPs (default: tests sample variants overhead reference, in that order; each writes OUTDIR/<step>.txt, stderr to <step>.stderr):
#   tests      the project's tests (pinned to the CPU backend) and the CUDA-only ones
#   sample     `pytest bench` on a copy of the shipped sample, auto backend (CUDA)
#   variants   collector_variants.py: ways of driving the profiler, cost per case and agreement
#   variants-batch  the same, only none, batch and batch-toggled
#   overhead   bench_overhead.py: pytest vs bare loop, 2000 small rows, 2 rounds
#   overhead-gc  the same with the cyclic garbage collector off on every side (its share of the cost)
#   overhead-clean  the same with only pytest's own plugins and the perf plugin (no other installed plugins)
# (OVERHEAD_ROUNDS and OVERHEAD_CASES set the overhead steps' rounds and rows, default 2 and 2000)
#   reference  compare_reference_cuda.py: harness vs CUPTI trace of a bare script, and ncu
#   reference-idle  the same, the GPU left idle 3 s before each kernel's reference (no ncu)
#   reference-verify  the same, each kernel's reference checked against float64 on the host first (no ncu)
#   kineto     kineto_config_cost.py: Kineto settings that might shrink a session of small kernels
#   profile    overhead_profile.py: where a small case's time goes, bare loop vs pytest, under cProfile
#   memory     bench_overhead.py --memory-only at 1,000 and 10,000 small rows: peak RSS and device memory
#   delimiting repeat_delimiting_effect.py: durations with one marker pair per case vs one per repeat
#   inputs     reference_input_sensitivity.py: a short kernel's duration on two same-distribution inputs
#   session-style  reference_session_style.py: a bare loop's session started before or after its warm-up calls
# A full run takes 10-15 minutes on an H100 host; give a few steps per call where a time limit applies.
set -uo pipefail
out=${1:?usage: cuda_evidence.sh OUTDIR [STEP ...]}
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests sample variants overhead reference)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."

python -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
# Images that ship without .pyc files recompile torch in every child process (~9 s each), which
# would swamp the start-up share of the overhead benchmark; a normal installation has them.
python -m compileall -q -j 0 "$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))')" >/dev/null 2>&1 || true
export PYTHONUNBUFFERED=1

run() {
    local name=$1
    shift
    echo "== $name: $*"
    local start=$SECONDS
    "$@" 2>"$out/$name.stderr" | tee "$out/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
python -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)' | tee -a "$out/gpu.txt"

for step in "${steps[@]}"; do
    case $step in
        tests)
            run tests python -m pytest tests -q -p no:cacheprovider -x ;;
        sample)
            sample=$(mktemp -d)
            cp -r database/data/CPU_X86_64/torch/torch2.13.0/. "$sample/"
            run sample python -m pytest bench --database-path "$sample" -q -p no:cacheprovider ;;
        variants)
            run variants python tests/perf/collector_variants.py --backend cuda --cases 512 --rounds 3 ;;
        variants-batch)
            run variants-batch python tests/perf/collector_variants.py --backend cuda --cases 512 --rounds 3 \
                --variants none,batch,batch-toggled ;;
        overhead)
            run overhead python tests/perf/bench_overhead.py --backend cuda --cases "${OVERHEAD_CASES:-2000}" --repeats 30 --rounds "${OVERHEAD_ROUNDS:-2}" ;;
        overhead-gc)
            run overhead-gc python tests/perf/bench_overhead.py --backend cuda --cases "${OVERHEAD_CASES:-2000}" --repeats 30 --rounds "${OVERHEAD_ROUNDS:-2}" --gc-off ;;
        overhead-clean)
            run overhead-clean python tests/perf/bench_overhead.py --backend cuda --cases "${OVERHEAD_CASES:-2000}" --repeats 30 --rounds "${OVERHEAD_ROUNDS:-2}" \
                --no-plugin-autoload ;;
        reference)
            run reference python tests/perf/compare_reference_cuda.py --repeats 50 --rounds "${REFERENCE_ROUNDS:-2}" ;;
        reference-idle)
            run reference-idle python tests/perf/compare_reference_cuda.py --repeats 50 --rounds "${REFERENCE_ROUNDS:-2}" \
                --idle-ms 3000 --no-ncu ;;
        reference-verify)
            run reference-verify python tests/perf/compare_reference_cuda.py --repeats 50 --rounds "${REFERENCE_ROUNDS:-2}" \
                --verify-first --no-ncu ;;
        kineto)
            run kineto python tests/perf/kineto_config_cost.py ;;
        profile)
            run profile python tests/perf/overhead_profile.py --backend cuda --cases 1000 --top 40 ;;
        memory)
            run memory bash -c 'for n in 1000 10000; do python tests/perf/bench_overhead.py --backend cuda --cases $n --memory-only; done' ;;
        delimiting)
            run delimiting python tests/perf/repeat_delimiting_effect.py --backend cuda --cases 400 ;;
        inputs)
            run inputs python tests/perf/reference_input_sensitivity.py --runs 4 ;;
        session-style)
            run session-style python tests/perf/reference_session_style.py ;;
        *)
            echo "unknown step $step" >&2
            exit 2 ;;
    esac
done
