#!/usr/bin/env bash
# The GPU campaign in one command, on a node with DeepEP built: every GPU path of moepolicy at one EP
# size, with a GPU per rank where EP GPUs are visible and with the ranks sharing them otherwise (the
# test-only MOEPOLICY_FUNCTIONAL_SHARED_RANKS=1: a functional run, no time compared). Each step logs to
# $OUT/<step>.log, prints its exit code, time and the log's tail; a failing step does not stop the rest.
# What each step must print: docs/BENCHMARKS.md, "The GPU campaign".
#   EP=8 OUT=gpu-out bash benchmarks/run_gpu_benchmarks.sh [--dry-run] [steps...]
#   campaign steps (the default, in this order): links validate tune bench null torchrun overlap tests
#   research steps (named only): dispatch sweep gemm placement overlap-green overlap-grouped
#     overlap-dense overlap-mean overlap-no-wait overlap-unclustered
#   --dry-run: print every command (one line each, '+ ' first) and run none
set -u
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
EP=${EP:-8}
OUT=${OUT:-gpu-out}
MODEL=${MODEL:-Qwen3-30B-A3B-FP8}
GPU_FLAG=(${GPU:+--gpu "$GPU"})  # GPU=h100|h200|...; default: moepolicy reads the GPU it runs on
PY=${PYTHON:-python3}
STEPS=${*:-links validate tune bench null torchrun overlap tests}
COMMIT=${MOEPOLICY_DEEPEP_COMMIT:-unknown}
# NVLink multicast stays off on shared hosts, for every process started here (moepolicy's ranks set it too)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MOEPOLICY_OFFLINE=${MOEPOLICY_OFFLINE:-1}
if [ "$DRY" = 1 ]; then GPUS=${GPUS:-$EP}; else
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
fi
if [ "$GPUS" -lt "$EP" ]; then
  export MOEPOLICY_FUNCTIONAL_SHARED_RANKS=1
  echo "== EP $EP on $GPUS GPU(s): the ranks share them, a functional run (no time is compared)"
else
  echo "== EP $EP on $GPUS GPU(s): a GPU per rank"
fi
[ "$DRY" = 1 ] || mkdir -p "$OUT"
STUDY="sqlite:///$OUT/studies.db"
MP=(-m moepolicy)
T0=$SECONDS

step() {  # step NAME COMMAND...: run it under STEP_TIMEOUT seconds, logged to $OUT/NAME.log
  local name=$1; shift
  if [ "$DRY" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; return 0; fi
  echo "== $name: $*"; local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-600}" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s (campaign at $((SECONDS - T0)) s)"
  tail -n "${TAIL:-12}" "$OUT/$name.log"
}

tune_live() {  # tune_live NAME EXTRA...: a short live tune of the main job at this EP size
  local name=$1; shift
  step "$name" "$PY" "${MP[@]}" tune --model "$MODEL" --ep-size "$EP" "${GPU_FLAG[@]}" --bench live \
    --tokens 1024,4096 --trials 4 --confirm-rounds 9 --storage "$STUDY" --study "campaign-$name" \
    -o "$OUT/$name.yaml" "$@"
}

for s in $STEPS; do case $s in
  links) step links-topo nvidia-smi topo -m
         step links "$PY" benchmarks/check_links.py "$EP" ;;
  validate) step validate-plan "$PY" "${MP[@]}" plan --model "$MODEL" --ep-size "$EP" "${GPU_FLAG[@]}" \
              --expert-kernel deepgemm -o "$OUT/plan.yaml"
            step validate "$PY" "${MP[@]}" validate "$OUT/plan.yaml" --live ;;
  tune) tune_live tune --sms 20,24,32 --expert-kernel deepgemm ;;
  bench) step bench "$PY" "${MP[@]}" bench "$OUT/tune.yaml" --transport deepep --tokens 128,1024,4096 \
           --rounds 24 --reps 10 --watchdog 300 -o "$OUT/bench.json" ;;
  null) step null-plan "$PY" "${MP[@]}" plan --model "$MODEL" --ep-size "$EP" "${GPU_FLAG[@]}" --rules vllm \
          -o "$OUT/null.yaml"
        step null "$PY" "${MP[@]}" bench "$OUT/null.yaml" --null --transport deepep --tokens 1024 \
          --routing uniform,zipf --rounds 24 --reps 10 --watchdog 300 -o "$OUT/null.json"
        step null-verdict "$PY" benchmarks/null_verdict.py "$OUT/null.json" ;;
  torchrun) step torchrun "$PY" -m torch.distributed.run --nproc-per-node "$EP" --master-port "${PORT:-29517}" \
              "${MP[@]}" tune --launcher torchrun --bench live --model "$MODEL" "${GPU_FLAG[@]}" --sms 24 --tokens 1024 \
              --trials 3 --confirm-rounds 9 --storage "$STUDY" --study campaign-torchrun \
              -o "$OUT/torchrun.yaml" ;;
  overlap) tune_live overlap --overlap --sms 20,24,32 ;;
  tests) step tests "$PY" -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider ;;
  dispatch) step bench_dispatch "$PY" benchmarks/bench_dispatch.py --out "$OUT/bench_dispatch.json" \
              --num-sms 24 --rounds 7 --reps 10 --deepep-commit "$COMMIT" ;;
  sweep) step bench_sms_sweep "$PY" benchmarks/bench_dispatch.py --out "$OUT/bench_sms_sweep.json" \
           --shapes deepseek-v3 --tokens 4096 --num-sms 16 20 32 48 --rounds 7 --reps 10 --skip-quant \
           --deepep-commit "$COMMIT" ;;
  gemm) step gemm_sm_sweep "$PY" benchmarks/gemm_sm_sweep.py --out "$OUT/gemm_sm_sweep.json" ;;
  placement) step diag_overlap_placement "$PY" benchmarks/diag_overlap_placement.py --tokens 1024 4096 \
               --sms 20 24 26 28 30 32 --out "$OUT/diag_overlap_placement.json" ;;
  overlap-green|overlap-grouped|overlap-dense|overlap-mean|overlap-no-wait|overlap-unclustered)
    case $s in overlap-green) extra=(--overlap-confine green);; overlap-grouped) extra=(--overlap-gemm grouped);;
               overlap-mean) extra=(--overlap-order mean);; overlap-no-wait) extra=(--overlap-order comm-first-no-wait);;
               overlap-unclustered) extra=(--overlap-gemm persistent);; *) extra=(--overlap-gemm dense);; esac
    tune_live "$s" --overlap "${extra[@]}" --sms 4,8,12,16,20,24,28,32,40,48,64 ;;
  *) echo "unknown step $s (see the header of $0)" ;;
esac; done
[ "$DRY" = 1 ] || echo "== campaign: $((SECONDS - T0)) s at EP $EP on $GPUS GPU(s); logs in $OUT"
