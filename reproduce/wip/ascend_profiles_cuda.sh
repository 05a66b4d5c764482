# The real Ascend Level1 and Level2 profiles, ingested and replayed on CUDA through the portable equivalents.
cd "$(pwd)"
python3 -m pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name --format=csv,noheader
for level in level1 level2_llm_train; do
  rm -rf /tmp/asc_$level && mkdir -p /tmp/asc_$level
  cp tests/fixtures/ascend/kernel_details_$level.csv /tmp/asc_$level/kernel_details.csv
  perfdb ingest --profiling-path /tmp/asc_$level/kernel_details.csv --database-path /tmp/asc_$level/db | head -3
  timeout 280 python3 -m pytest bench --perf-database-path /tmp/asc_$level/db --perf-backend cuda --perf-repeat-count 5 \
    --perf-warmup-count 2 -q -p no:cacheprovider -rfs --perf-replay-coverage-min 0.9 --perf-replay-coverage-weight time 2>&1 \
    | grep -E "coverage|passed|failed|SKIPPED|FAILED" | cut -c1-420
done
python3 - <<'PY'
import glob, json
for f in sorted(glob.glob('/tmp/asc_*/db/reports/run_report_*.json')):
    for r in json.load(open(f))['results']:
        if r['outcome'] not in ('passed', 'unsupported'):
            print(f.split('/')[2], r['kernel_type'], r['outcome'], str(r.get('reason'))[:300])
PY
