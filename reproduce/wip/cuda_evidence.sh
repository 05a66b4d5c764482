#!/usr/bin/env bash
# The CUDA measurements docs/measured.md reports ("Measured", the NVIDIA H100 part), on one machine with
# an NVIDIA GPU and torch built for it: the project's tests, `pytest bench` on the shipped sample,
# and the benchmark and reproduction scripts behind the other figures, one step each.
#
# Verification missing: needs an NVIDIA GPU; not run on this version.  It writes no JSON report
# of its own: the reproduce/ scripts it runs write theirs under OUTDIR/<step>/.
#
# Prerequisites: an NVIDIA GPU, Python with torch built for CUDA, pip (the script installs this
# checkout with `pip install -e .`), `nvidia-smi`; `ncu` for the reference step's Nsight Compute
# column.
#
#   bash reproduce/wip/cuda_evidence.sh OUTDIR [STEP ...]
#   bash reproduce/wip/cuda_evidence.sh --help
#
# STEPs (default: tests sample variants overhead reference, in that order; each writes OUTDIR/<step>.txt, stderr to <step>.stderr,
# and the reproduce/ scripts their JSON report under OUTDIR/<step>/):
#   tests      the project's tests (pinned to the CPU backend) and the CUDA-only ones
#   sample     `pytest bench` on a copy of the shipped sample, auto backend (CUDA)
#   variants   reproduce/wip/collector_variants.py: ways of driving the profiler, cost per case and agreement
#   variants-batch  the same, only none, batch and batch-toggled
#   overhead   benchmarks/bench_overhead.py: pytest vs bare loop, 2000 small rows, 2 rounds
#   overhead-gc  the same with the cyclic garbage collector off on every side (its share of the cost)
#   overhead-clean  the same with only pytest's own plugins and the perf plugin (no other installed plugins)
# (OVERHEAD_ROUNDS and OVERHEAD_CASES set the overhead steps' rounds and rows, default 2 and 2000)
#   reference  reproduce/wip/compare_reference_cuda.py: harness vs CUPTI trace of a bare script, and ncu
#   reference-idle  the same, the GPU left idle 3 s before each kernel's reference (no ncu)
#   reference-verify  the same, each kernel's reference checked against float64 on the host first (no ncu)
#   memory     benchmarks/bench_overhead.py --memory-only at 1,000 and 10,000 small rows: peak RSS and device memory
#   throughput benchmarks/bench_throughput.py: bare loop, harness and harness with the previous collector side by
#              side (THROUGHPUT_CASES rows, default 2000, 3 rounds), and the harness's peak RSS at 10,000 rows of one shape
#   memory-100k  benchmarks/bench_throughput.py: the harness's peak RSS at 100,000 rows of one shape (~7 minutes)
#   delimiting reproduce/repeat_delimiting_effect.py: durations with one marker pair per case vs one per repeat
#   inputs     reproduce/wip/reference_input_sensitivity.py: a short kernel's duration on two same-distribution inputs
#   session-style  reproduce/wip/reference_session_style.py: a bare loop's session started before or after its warm-up calls
#   model-trace  reproduce/wip/model_trace_replay_cuda.py: 4 Llama-3.1-8B layers profiled, ingested and replayed
#   cache-modes  reproduce/wip/cache_modes_vs_model.py: the same layers' prefill and decode replayed in each cache mode
#   candidates  the example candidates (examples/candidates/*.py) judged on the RmsNorm and SwiGlu rows of the
#              shipped sample widened by perfdb grid to Llama-3.1-8B's and Qwen3-32B's shapes; artifacts in candidates.tar.gz
#   workers    benchmarks/bench_workers.py: one database replayed by 1 and by 2 xdist workers (needs 2 GPUs), small
#              Add rows (WORKERS_ROWS, default 6000) and the sample widened to Llama-3.1-8B's shapes
# (The former steps kineto and profile ran one-off investigations: see docs/investigations.md.)
# A full run takes 10-15 minutes on an H100 host; give a few steps per call where a time limit applies.
set -uo pipefail
case ${1:-} in
    -h|--help)
        sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0 ;;
esac
out=${1:?usage: cuda_evidence.sh OUTDIR [STEP ...] (--help: the steps)}
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
            run sample python -m pytest bench --perf-database-path "$sample" -q -p no:cacheprovider ;;
        variants)
            run variants python reproduce/wip/collector_variants.py --backend cuda --cases 512 --rounds 3 --out "$out/variants" ;;
        variants-batch)
            run variants-batch python reproduce/wip/collector_variants.py --backend cuda --cases 512 --rounds 3 \
                --variants none,batch,batch-toggled --out "$out/variants-batch" ;;
        overhead)
            run overhead python benchmarks/bench_overhead.py --backend cuda --cases "${OVERHEAD_CASES:-2000}" --repeats 30 --rounds "${OVERHEAD_ROUNDS:-2}" ;;
        overhead-gc)
            run overhead-gc python benchmarks/bench_overhead.py --backend cuda --cases "${OVERHEAD_CASES:-2000}" --repeats 30 --rounds "${OVERHEAD_ROUNDS:-2}" --gc-off ;;
        overhead-clean)
            run overhead-clean python benchmarks/bench_overhead.py --backend cuda --cases "${OVERHEAD_CASES:-2000}" --repeats 30 --rounds "${OVERHEAD_ROUNDS:-2}" \
                --no-plugin-autoload ;;
        reference)
            run reference python reproduce/wip/compare_reference_cuda.py --repeats 50 --rounds "${REFERENCE_ROUNDS:-2}" --out "$out/reference" ;;
        reference-idle)
            run reference-idle python reproduce/wip/compare_reference_cuda.py --repeats 50 --rounds "${REFERENCE_ROUNDS:-2}" \
                --idle-ms 3000 --no-ncu --out "$out/reference-idle" ;;
        reference-verify)
            run reference-verify python reproduce/wip/compare_reference_cuda.py --repeats 50 --rounds "${REFERENCE_ROUNDS:-2}" \
                --verify-first --no-ncu --out "$out/reference-verify" ;;
        memory)
            run memory bash -c 'for n in 1000 10000; do python benchmarks/bench_overhead.py --backend cuda --cases $n --memory-only; done' ;;
        throughput)
            run throughput python benchmarks/bench_throughput.py --backend cuda --cases "${THROUGHPUT_CASES:-2000}" --rounds 3 \
                --memory-rows 10000 ;;
        memory-100k)
            run memory-100k python benchmarks/bench_throughput.py --backend cuda --cases 0 --memory-rows 100000 ;;
        delimiting)
            run delimiting python reproduce/repeat_delimiting_effect.py --backend cuda --cases 400 --out "$out/delimiting" ;;
        inputs)
            run inputs python reproduce/wip/reference_input_sensitivity.py --runs 4 --out "$out/inputs" ;;
        session-style)
            run session-style python reproduce/wip/reference_session_style.py --out "$out/session-style" ;;
        model-trace)
            run model-trace python reproduce/wip/model_trace_replay_cuda.py --out "$out/model-trace" ;;
        cache-modes)
            run cache-modes bash -c "python reproduce/wip/cache_modes_vs_model.py --tokens 512 --backend cuda --out '$out/cache-modes/prefill' && python reproduce/wip/cache_modes_vs_model.py --tokens 16 --backend cuda --out '$out/cache-modes/decode'" ;;
        candidates)
            db=$(mktemp -d)
            cp -r database/data/CPU_X86_64/torch/torch2.13.0/. "$db/"
            python -m perf_plugin.cli grid --data-dir "$db" --target-models llama-3.1-8b,qwen3-32b \
                --kernel-types RmsNorm,SwiGlu --rows 40 --seed 0 >"$out/candidates-grid.txt" 2>&1
            for file in triton_rmsnorm compiled_swiglu flawed; do
                run "candidates-$file" python -m pytest bench --perf-database-path "$db" --perf-no-writeback \
                    -k "RmsNorm or SwiGlu" --perf-candidate "examples/candidates/$file.py" \
                    --perf-candidate-fast-p 0,1,1.5,2 --perf-candidate-log-dir "$out/candidates/$file" -q -p no:cacheprovider
            done
            tar -czf "$out/candidates.tar.gz" -C "$out" candidates && rm -rf "$out/candidates" ;;
        workers)
            run workers bash -c "python benchmarks/bench_workers.py --backend cuda --workers 1,2 --rows ${WORKERS_ROWS:-6000} --rounds 2 \
                && python benchmarks/bench_workers.py --backend cuda --workers 1,2 --grid llama-3.1-8b --grid-rows 100 --rounds 1" ;;
        *)
            echo "unknown step $step" >&2
            exit 2 ;;
    esac
done
