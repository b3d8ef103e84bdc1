#!/usr/bin/env bash
# The GPU checks as one short run, for a machine with a CUDA GPU (under 10 minutes on one H200):
#   1. the tests named *_on_gpu_* (skipped where there is no GPU): bf16 forward and backward as close to
#      fp32 as transformers' bf16 on the GPU; generate on the GPU (eager, and compiled: the static step in a
#      CUDA graph) gives the CPU's tokens; the tiny world's RL run on the GPU (autocast, bf16 rollout copy,
#      compiled decode) clears the CPU's bar;
#   2. bench_sample.py on the GPU: ours, ours compiled and transformers' generate at batch 1, 8 and 32;
#   3. bench_sample.py --ragged: continuous batching (and its static step) against chunks, ragged lengths;
#   4. bench_sample.py --throughput: nano-vllm- and RL-shaped workloads on Qwen3-0.6B widths, tokens/s and
#      the fraction of the bandwidth roof, beside transformers' generate (issue #19's target: >= 22%);
#   5. gpu_rl_check.py: a random-weight Qwen3-0.6B-Base checkpoint (offline), train_rl.py at the brief's shape
#      (8 x 8, 512 tokens, 3 steps, bf16) with its time split, peak memory and an exact resume after step 2;
#      evaluate.py on math500 --limit 128 at 2,048 tokens, continuous batching on and off; --fsdp on one process.
# Each step under its own timeout, about 9 minutes in all on one H200. Logs go to $OUT (or runs/gpu_check).
#   bash benchmarks/gpu_check.sh
#   DEVICE=cpu QUICK=1 bash benchmarks/gpu_check.sh   # the same script on a CPU, small shapes (tests/test_gpu_check.py)
set -o pipefail
out=${OUT:-runs/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
status=0
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
              '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
} 2>&1 | tee "$out/env.txt"
device=${DEVICE:-cuda}
quick=${QUICK:+--quick}
if [ "$device" = cuda ]; then  # the sampler's checks need a GPU; on a CPU only step 5 runs, with small shapes
  timeout 110 $python -m pytest -q -rs -k on_gpu tests/ 2>&1 | tee "$out/tests.txt" || status=1
  timeout 100 $python research/sampler/bench_sample.py --device cuda --compile 2>&1 | tee "$out/bench_sample.txt" || status=1
  timeout 45 $python research/sampler/bench_sample.py --device cuda --ragged 2>&1 | tee "$out/bench_ragged.txt" || status=1
  timeout 100 $python research/sampler/bench_sample.py --device cuda --throughput --repeats 1 2>&1 | tee "$out/bench_throughput.txt" || status=1
fi
timeout 200 $python benchmarks/gpu_rl_check.py --device "$device" $quick --timeout 60 --out "$out/rl" 2>&1 | tee "$out/rl_check.txt" || status=1
exit $status
