#!/usr/bin/env bash
# The GPU measurements behind docs/BENCHMARKS.md, in one go, on a machine with 2 GPUs and DeepEP
# importable. Every step logs to $OUT (default ./gpu-out) and a failing step does not stop the rest.
#   OUT=gpu-out bash benchmarks/run_gpu_benchmarks.sh [steps...]
#   (steps: tests bench sweep gemm placement overlap overlap-unclustered overlap-mean overlap-no-wait overlap-green overlap-grouped overlap-dense; default all)
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
STEPS=${*:-tests bench sweep gemm placement overlap overlap-unclustered overlap-mean overlap-no-wait overlap-green overlap-grouped overlap-dense}
COMMIT=${MOEPOLICY_DEEPEP_COMMIT:-unknown}
step() { local name=$1; shift; echo "== $name: $*"; local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-400}" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"; tail -n "${TAIL:-25}" "$OUT/$name.log"; }
for s in $STEPS; do case $s in
  tests) step gpu_tests python -m pytest -m gpu tests/ -q -rs ;;
  bench) step bench_dispatch python benchmarks/bench_dispatch.py --out "$OUT/bench_dispatch.json" --num-sms 24 \
           --rounds 7 --reps 10 --deepep-commit "$COMMIT" ;;
  sweep) step bench_sms_sweep python benchmarks/bench_dispatch.py --out "$OUT/bench_sms_sweep.json" --shapes deepseek-v3 \
           --tokens 4096 --num-sms 16 20 32 48 --rounds 7 --reps 10 --skip-quant --deepep-commit "$COMMIT" ;;
  overlap) for m in DeepSeek-V3 Qwen3-30B-A3B-FP8; do
           step "overlap-$m" python -m moepolicy tune --model "$m" --bench live --overlap --sms 4,6,8,12,16,24,28,30,32,34,36,40,48,64 \
             --tokens 1024,4096 --trials 16 --confirm-rounds 5 -o "$OUT/overlap-$m.yaml" \
             --storage "sqlite:///$OUT/studies.db"; done ;;
  gemm) step gemm_sm_sweep python benchmarks/gemm_sm_sweep.py --out "$OUT/gemm_sm_sweep.json" ;;
  placement) step diag_overlap_placement python benchmarks/diag_overlap_placement.py --tokens 1024 4096 \
           --sms 20 24 26 28 30 32 --out "$OUT/diag_overlap_placement.json" ;;
  overlap-green|overlap-grouped|overlap-dense|overlap-mean|overlap-no-wait|overlap-unclustered)
         case $s in overlap-green) extra="--overlap-confine green";; overlap-grouped) extra="--overlap-gemm grouped";;
                    overlap-mean) extra="--overlap-order mean";;
                    overlap-no-wait) extra="--overlap-order comm-first-no-wait";;
                    overlap-unclustered) extra="--overlap-gemm persistent";;
                    *) extra="--overlap-gemm dense";; esac
         for m in DeepSeek-V3 Qwen3-30B-A3B-FP8; do
           step "$s-$m" python -m moepolicy tune --model "$m" --bench live --overlap $extra \
             --sms 4,6,8,12,16,24,28,30,32,34,36,40,48,64 --tokens 1024,4096 --trials 16 --confirm-rounds 5 -o "$OUT/$s-$m.yaml" \
             --storage "sqlite:///$OUT/studies-$s.db"; done ;;
  *) echo "unknown step $s" ;;
esac; done
