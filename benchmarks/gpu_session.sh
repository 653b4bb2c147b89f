#!/usr/bin/env bash
# One prepared device session (≤ 10 minutes of GPU time), for when a GPU machine is lent:
#   1. the paper's comparison at SD3.5-Medium size: time per iteration (and its split) of TreeGRPO k=2, w=3
#      vs window-SDE and all-step-SDE trajectory GRPO, same 8 leaves per prompt, random weights at 512 px;
#   2. the per-family split at the published sizes (SD1.5, SDXL, SD3.5-M, Flux-dev), TreeGRPO only;
#   3. training a Dynamic VRAM patcher of ComfyUI 0.33+ (benchmarks/gpu_dynamic_vram.py);
#   4. the cost of one iteration through the ComfyUI path, whole at the published depth (benchmarks/bench_iteration.py).
# Results land in $OUT (or benchmarks/results) as families_gpu_methods.json, families_gpu.json, dynamic_vram.json and
# iteration_gpu.json.
#   bash benchmarks/gpu_session.sh            # DEVICE=cuda HEIGHT=512 ITERS=2 by default
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
DEVICE=${DEVICE:-cuda}
HEIGHT=${HEIGHT:-512}
ITERS=${ITERS:-2}
LAYERS=${LAYERS:-0}          # >0 caps the denoiser depth: a CPU smoke test of this script
# CPU smoke test: DEVICE=cpu HEIGHT=32 ITERS=1 LAYERS=1 METHODS_FAMILY=sd15 FAMILIES=sd15 OUT=/tmp/x bash ...
DEST=${OUT:-benchmarks/results}
mkdir -p "$DEST"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
timeout "${T_METHODS:-300}" $PY benchmarks/bench_families.py --random-size real --families "${METHODS_FAMILY:-sd35m}" \
    --methods tree,traj_window,traj_all --device "$DEVICE" --height "$HEIGHT" --iterations "$ITERS" \
    --layers "$LAYERS" --out "$DEST/families_gpu_methods.json" || echo "method timings stopped (time limit)"
timeout "${T_FAMILIES:-180}" $PY benchmarks/bench_families.py --random-size real --families "${FAMILIES:-sd15,sdxl,sd35m,flux}" \
    --device "$DEVICE" --height "$HEIGHT" --iterations "$ITERS" --layers "$LAYERS" \
    --out "$DEST/families_gpu.json" || echo "per-family timings stopped (time limit): partial results above"
# 3. Dynamic VRAM (ComfyUI 0.33+, on by default on NVIDIA): a Flux-shaped model loaded dynamic and plain by the core
#    loader; the pack must train the dynamic one (through its non-dynamic delegate) to the same LoRA gradient.
#    Needs the newest ComfyUI tree extracted in .cache/ (carry .cache/comfyui-<version>) with its requirements.
timeout "${T_DYNAMIC:-100}" $PY benchmarks/gpu_dynamic_vram.py --device "$DEVICE" --out "$DEST/dynamic_vram.json" \
    || echo "dynamic VRAM check failed or stopped (see above)"
# 4. The cost of one iteration through the ComfyUI path (issue 35): tree, window GRPO and all-step GRPO on the
#    published architectures, composed from per-row costs and, with --whole, run whole at the published depth.
timeout "${T_ITERATION:-240}" $PY benchmarks/bench_iteration.py --gpu --whole --px "$HEIGHT" \
    --models "${ITER_MODELS:-sd15,sdxl,sd35m}" --out "$DEST/iteration_gpu.json" \
    || echo "iteration timings stopped (time limit)"
