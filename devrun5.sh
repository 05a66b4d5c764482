python3 -m pip install --no-deps --no-build-isolation -q -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name --format=csv,noheader
run_model() {  # gpu run model
  CUDA_VISIBLE_DEVICES=$1 timeout 170 python3 benchmarks/model_coverage.py --models $3 --layers 2 --decode-steps 4 --repeats 20 --reference-spread --out /tmp/$2 > /tmp/log_$2_$3.txt 2>&1
  echo "$2 $3 exit $?" >> /tmp/log_$2_$3.txt
}
( for m in deepseek-v3 phi3 qwen2; do run_model 0 a $m; run_model 0 b $m; done ) &
( for m in olmoe mixtral; do run_model 1 a $m; run_model 1 b $m; done ) &
wait
for f in /tmp/log_*; do grep -h "coverage\|spread\|exit" $f | grep -v "pytest bench"; done
cd /tmp && tar czf $OUT/dbs5.tgz a/*/db_auto/*.csv b/*/db_auto/*.csv log_*.txt a/*/reference_spread.json b/*/reference_spread.json 2>&1 | tail -1
