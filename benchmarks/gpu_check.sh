#!/usr/bin/env bash
# The GPU checks as one short run, for a machine with a CUDA GPU (under 10 minutes on one H100 or H200):
#   1. the tests named *_on_gpu_* (skipped where there is no GPU): bf16 forward and backward as close to
#      fp32 as transformers' bf16 on the GPU; generate on the GPU (eager, and compiled: the static step in a
#      CUDA graph) gives the CPU's tokens; the tiny world's RL run on the GPU (autocast, bf16 rollout copy,
#      compiled decode) clears the CPU's bar;
#   2. bench_sample.py on the GPU: ours, ours compiled and transformers' generate at batch 1, 8 and 32;
#   3. bench_sample.py --ragged: continuous batching (and its static step) against chunks, ragged lengths;
#   4. bench_sample.py --throughput: nano-vllm- and RL-shaped workloads on Qwen3-0.6B widths, tokens/s and
#      the fraction of the bandwidth roof, beside transformers' generate (issue #19's target: >= 22%);
#   5. gpu_rl_check.py: a random-weight Qwen3-0.6B-Base checkpoint (offline), train_rl.py at the brief's shape
#      (8 x 8, 512 tokens, 3 steps, bf16) with its time split, peak memory beside the memory plan it printed
#      (memory.py; summary.json's train.memory_plan_gib, peak_gib, peak_over_plan) and an exact resume after step 2;
#      evaluate.py on math500 --limit 128 at 2,048 tokens, continuous batching on and off; --fsdp on one process.
# Each step under its own timeout, about 9 minutes in all. STEPS="2 5" reruns only those steps.
# The logs go to $OUT (default runs/gpu_check) as 7 small files, because a device run brings back at most
# 8 (summary.txt: the machine and each step's exit; step 5's logs as rl_logs.tar.gz); the checkpoints go
# to $WORK (default runs/gpu_check_work), and step 5 deletes the weights it wrote once it has compared them.
#   bash benchmarks/gpu_check.sh
#   DEVICE=cpu QUICK=1 bash benchmarks/gpu_check.sh   # the same script on a CPU, small shapes (tests/test_gpu_check.py)
set -o pipefail
out=${OUT:-runs/gpu_check}
work=${WORK:-runs/gpu_check_work}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
quick=${QUICK:+--quick}
steps=" ${STEPS:-1 2 3 4 5} "
status=0
{ if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  else echo "no nvidia-smi"; fi
  $python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
              '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
} 2>&1 | tee "$out/summary.txt"

step() {  # step NUMBER SECONDS LOG COMMAND...: run it if STEPS names it, log its exit in summary.txt
  local n=$1 secs=$2 log=$3; shift 3
  case $steps in *" $n "*) ;; *) return ;; esac
  timeout "$secs" "$@" 2>&1 | tee "$out/$log"
  local code=$?
  echo "step $n ($log): exit $code$([ $code = 124 ] && echo ", timed out after $secs s")" >> "$out/summary.txt"
  [ $code = 0 ] || status=1
}

if [ "$device" = cuda ]; then  # the sampler's checks need a GPU; on a CPU only step 5 runs, with small shapes
  step 1 110 tests.txt $python -m pytest -q -rs -p no:cacheprovider -k on_gpu tests/
  step 2 100 bench_sample.txt $python research/sampler/bench_sample.py --device cuda --compile
  step 3 45 bench_ragged.txt $python research/sampler/bench_sample.py --device cuda --ragged
  step 4 100 bench_throughput.txt $python research/sampler/bench_sample.py --device cuda --throughput --repeats 1
fi
step 5 200 rl_check.txt $python benchmarks/gpu_rl_check.py --device "$device" $quick --timeout 60 --out "$work/rl"
case $steps in *" 5 "*)  # the logs, metrics and summaries of every try, without the weights
  find "$work/rl" -maxdepth 3 -type f \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' \) ! -name tokenizer.json \
    -printf '%P\0' | tar czf "$out/rl_logs.tar.gz" -C "$work/rl" --null -T - ;;
esac
echo "--- summary.txt"; cat "$out/summary.txt"
exit $status
