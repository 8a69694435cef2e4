#!/bin/bash
# The checks and benchmarks to run on a GPU machine, in one go (docs/benchmarks.md, "CUDA path"):
#   scripts/gpu_checks.sh [OUT_DIR] [DEVICE]
# 1. scripts/check_cuda_path.py in float16 and bfloat16 (tiny demo models, no weights needed): SD-XL/SD
#    generate, AC resume, cascade, profile measure, and the DiT checks (tiny FLUX.1 and SD3 on the
#    device in that dtype, bit-exact flow-matching resume, a First Block Cache level, DiT edits);
# 2. the router's prompt stage with its MiniLM on the GPU (scripts/bench_router_encoder.py);
# 3. the cascade discriminator's latency on the GPU (scripts/bench_classifier.py).
# Everything goes to OUT_DIR/log.txt and the reports under OUT_DIR/<dtype>/. Each step has a time
# limit, so the whole run stays under 10 minutes (2 × 180 + 120 + 90 s of limits); a failed step does not stop the others.
set -o pipefail
OUT_DIR=${1:-gpu-check}
DEVICE=${2:-cuda}
cd "$(dirname "$0")/.."
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/log.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
quiet() { grep -v -e "should be kept in float32" -e "^Loading weights" -e "it/s]" ; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  python3 -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee -a "$LOG"
status=0
for dt in float16 bfloat16; do
  echo "=== check_cuda_path --device $DEVICE --dtype $dt" | tee -a "$LOG"
  timeout 180 python3 scripts/check_cuda_path.py --device "$DEVICE" --dtype $dt --out "$OUT_DIR/$dt" \
    --models-dir "${TMPDIR:-/tmp}/argusdiff-gpu-models" 2>&1 | quiet | tee -a "$LOG" || status=1
done
echo "=== bench_router_encoder --device $DEVICE (float32, open loop at 200 prompts/s)" | tee -a "$LOG"
timeout 120 python3 scripts/bench_router_encoder.py --device "$DEVICE" --reps 3 --prompts 256 --rate 200 2>&1 \
  | quiet | tee -a "$LOG"
echo "=== bench_classifier --discriminator-only --device $DEVICE" | tee -a "$LOG"
timeout 90 python3 scripts/bench_classifier.py --discriminator-only --device "$DEVICE" --reps 20 2>&1 | quiet | tee -a "$LOG"
date -u | tee -a "$LOG"
exit $status
