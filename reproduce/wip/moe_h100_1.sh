set -x
cd "$(pwd)"
python3 -m pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 benchmarks/grouped_gemm_routing.py --out /tmp/ggr --iterations 3 --repeats 30 2>&1 | grep -v "^USDT\|STAGE:" | tail -30
cp /tmp/ggr/grouped_gemm_routing.json $OUT/ 2>/dev/null
timeout 230 python3 benchmarks/model_coverage.py --models mixtral --layers 2 --decode-steps 4 --repeats 20 --reference-spread --out /tmp/mc 2>&1 | grep -v "^USDT\|STAGE:" | tail -45
cp /tmp/mc/model_coverage.json $OUT/mc_mixtral.json 2>/dev/null
python3 - <<'PY'
import csv, glob
for f in glob.glob('/tmp/mc/mixtral/db_auto/GroupedMatmul.csv'):
    for r in csv.DictReader(open(f)):
        print(r['Input Shapes'], r.get('Input Values','')[:80], r.get('Input Values Source'), r['Profiling Average Duration(us)'], r.get('Average Duration(us)'))
PY
