cd "$(pwd)"
python3 -m pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2
for m in deepseek-v3 olmoe phi3; do
  timeout 170 python3 benchmarks/model_coverage.py --models $m --layers 4 --decode-steps 4 --repeats 20 --reference-spread --out /tmp/mc4_$m 2>&1 | grep "coverage\|spread\|pytest bench"
  cp /tmp/mc4_$m/model_coverage.json $OUT/mc4_$m.json 2>/dev/null
  python3 - "$m" <<'PY'
import csv, glob, json, sys
m = sys.argv[1]
db = f'/tmp/mc4_{m}/{m}/db_auto'
for f in sorted(glob.glob(f'{db}/reports/run_report_*.json'))[-1:]:
    for r in json.load(open(f))['results']:
        if r['outcome'] != 'passed':
            print('  NOT PASSED', r['csv_file'], r['row_line'], r['outcome'], str(r.get("reason"))[:160])
rows = []
for f in glob.glob(f'{db}/*.csv'):
    for line, r in enumerate(csv.DictReader(open(f)), start=2):
        try:
            p, a, n = float(r['Profiling Average Duration(us)']), float(r['Average Duration(us)']), int(r.get('Profiling Count') or 1)
        except (ValueError, KeyError):
            continue
        rows.append((p * n, a / p, f.split('/')[-1], line, r))
tot = sum(x[0] for x in rows)
out = sorted([x for x in rows if not 0.9 <= x[1] <= 1.1], key=lambda x: -x[0])
print(f'  out of band: {100*sum(x[0] for x in out)/tot:.1f}% of replayed time')
for share, ratio, name, line, r in out[:8]:
    print(f'  {name}:{line} ratio {ratio:.3f} share {100*share/tot:.2f}% n={r.get("Profiling Count")} idle={r.get("Profiling Average Launched Idle","")} '
          f'code={r.get("Profiling Average Code Reuse Distance(kernels)","")} reuse={r.get("Profiling Input Reuse Distance(B)","")[:40]} '
          f'in={r["Input Shapes"][:60]} {r["Input Data Types"][:30]} strides={r.get("Input Strides","")[:40]}')
    print(f'      model: {r.get("Profiling Kernels","")[:150]}')
    print(f'      bench: {r.get("MicroBench Kernels","")[:150]}')
PY
done
