cd "$(pwd)"
python3 -m pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2
for m in deepseek-v3 olmoe qwen2 phi3; do
  timeout 150 python3 benchmarks/model_coverage.py --models $m --layers 2 --decode-steps 4 --repeats 20 --reference-spread --out /tmp/mc_$m 2>&1 | grep -v "^USDT\|STAGE:\|UserWarning\|_warn_once" | grep -v "  0\.[0-4][0-9]%  " | tail -22
  cp /tmp/mc_$m/model_coverage.json $OUT/mc_$m.json 2>/dev/null
  python3 - "$m" <<'PY'
import json, glob, sys
m = sys.argv[1]
for f in sorted(glob.glob(f'/tmp/mc_{m}/{m}/db_auto/reports/run_report_*.json'))[-1:]:
    for r in json.load(open(f))['results']:
        if r['outcome'] != 'passed':
            print('  NOT PASSED', r['csv_file'], r['row_line'], r['outcome'], str(r.get("reason"))[:200])
PY
done
python3 - <<'PY'
import csv, glob
for f in glob.glob('/tmp/mc_*/*/ingested/ConcatD.csv'):
    for r in csv.DictReader(open(f)):
        if ';;' in r['Input Data Types'] or r['Input Data Types'].startswith(';') or r['Input Data Types'] == '':
            print(f.split('/')[2], r['Input Shapes'], r['Input Data Types'], r['Output Data Types'], r.get('Profiling Kernels','')[:300])
PY
