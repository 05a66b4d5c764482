#!/usr/bin/env bash
# The databases behind the lookup accuracy figures on CUDA (docs/lookup.md, "How well it answers").
#
#   bash reproduce/lookup_accuracy_cuda.sh gemm   OUT_DIR   # peaks; bf16 and fp8 GEMMs of three dense models
#   bash reproduce/lookup_accuracy_cuda.sh others OUT_DIR   # MoE grouped GEMMs over expert load, RmsNorm/Add/SwiGlu
#   bash reproduce/lookup_accuracy_cuda.sh attention OUT_DIR  # FIA decode/prefill over KV length distributions
#                                                             # (both: reproduce/lookup_grid.yaml)
# and the same kernels at twice the density in token counts, batch sizes and lengths
# (reproduce/lookup_grid_dense.yaml), each into its own OUT_DIR:
#   bash reproduce/lookup_accuracy_cuda.sh dense-gemm OUT_DIR       # bf16 and fp8 GEMMs, 6096 rows
#   bash reproduce/lookup_accuracy_cuda.sh dense-others OUT_DIR     # RmsNorm/Add/SwiGlu, 720 rows
#   bash reproduce/lookup_accuracy_cuda.sh dense-attention OUT_DIR  # FIA with even KV lengths, 1160 rows
#   bash reproduce/lookup_accuracy_cuda.sh dense-grouped OUT_DIR    # MoE grouped GEMMs over six expert loads
#   bash reproduce/lookup_accuracy_cuda.sh dense-varlen OUT_DIR     # packed (TND) FlashAttentionScore prefills
#                                                                   # over three length distributions
# then, anywhere:
#   python benchmarks/lookup_accuracy.py --database-path OUT_DIR/db --roofline --policy --plots OUT_DIR/plots
#
# Prerequisites: a CUDA GPU, this project installed (pip install -e .). Each part takes minutes; an
# interrupted run keeps what it measured (write-back on SIGINT), and a rerun measures only the rest.
set -euo pipefail
part=${1:?gemm, others, attention or dense-gemm, dense-others, dense-attention, dense-varlen, dense-grouped}
out=${2:?output directory}
db="$out/db"
mkdir -p "$db"
run_bench() {
    # SIGINT at the deadline: the session writes back what it measured and stops
    timeout -s INT "${BENCH_SECONDS:-480}" pytest bench -q -p no:cacheprovider --perf-backend cuda \
        --perf-database-path "$db" --perf-update-mode missing-only --perf-progress-interval 60 "$@" || true
}
case "$part" in
gemm)
    [ -f "$db/device_peaks.yaml" ] || perfdb peaks --database-path "$db"
    perfdb grid --database-path "$db" --kernel-types MatMulV2,aten._scaled_mm \
        --target-models llama-3.1-8b,qwen3-32b,llama-3.1-70b --rows 100000 --max-hbm-gb 40
    run_bench -k "MatMulV2 or _scaled_mm"
    ;;
others)
    [ -f "$db/device_peaks.yaml" ] || perfdb peaks --database-path "$db"
    here=$(cd "$(dirname "$0")" && pwd)
    grid() { perfdb grid --config "$here/lookup_grid.yaml" --database-path "$db" --rows 100000 --max-hbm-gb 40 \
        --kernel-types "$1" --target-models "$2"; }
    grid GroupedMatmul qwen3-235b-a22b
    grid RmsNorm,Add,SwiGlu llama-3.1-8b,qwen3-32b,llama-3.1-70b
    run_bench -k "GroupedMatmul or RmsNorm or Add or SwiGlu"
    ;;
attention)
    # the attention rows alone, once per KV length distribution (the route's kv_lengths)
    [ -f "$db/device_peaks.yaml" ] || perfdb peaks --database-path "$db"
    here=$(cd "$(dirname "$0")" && pwd)
    perfdb grid --config "$here/lookup_grid.yaml" --database-path "$db" --rows 100000 --max-hbm-gb 40 \
        --kernel-types FusedInferAttentionScore --target-models llama-3.1-8b
    run_bench -k FusedInferAttentionScore
    ;;
dense-*)
    [ -f "$db/device_peaks.yaml" ] || perfdb peaks --database-path "$db"
    here=$(cd "$(dirname "$0")" && pwd)
    dense() { perfdb grid --config "$here/lookup_grid_dense.yaml" --database-path "$db" --rows 100000 \
        --max-hbm-gb 40 --kernel-types "$1" --target-models "$2"; }
    case "$part" in
    dense-gemm) kinds=MatMulV2,aten._scaled_mm models=llama-3.1-8b,qwen3-32b,llama-3.1-70b
        select="MatMulV2 or _scaled_mm" ;;
    dense-others) kinds=RmsNorm,Add,SwiGlu models=llama-3.1-8b,qwen3-32b,llama-3.1-70b
        select="RmsNorm or Add or SwiGlu" ;;
    dense-attention) kinds=FusedInferAttentionScore models=llama-3.1-8b select=FusedInferAttentionScore ;;
    dense-varlen) kinds=FlashAttentionScore models=llama-3.1-8b select=FlashAttentionScore ;;
    dense-grouped) kinds=GroupedMatmul models=qwen3-235b-a22b select=GroupedMatmul ;;
    *) echo "part: dense-gemm, dense-others, dense-attention, dense-varlen or dense-grouped" >&2; exit 2 ;;
    esac
    dense "$kinds" "$models"
    run_bench -k "$select"
    ;;
*)
    echo "part: gemm, others, attention, dense-gemm, dense-others, dense-attention, dense-varlen or dense-grouped" >&2
    exit 2
    ;;
esac
