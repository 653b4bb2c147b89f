#!/usr/bin/env bash
# The prepared device session: everything issue 52 asks of a lent GPU, whole in BUDGET_S seconds (450: it fits the
# 8 minutes of one call with the machine's start outside it) from a bare machine. Prepare here first:
#   bash benchmarks/gpu_prepare.sh        # .gpu/: the wheels the machine lacks, the newest ComfyUI tarball
# then with the device tool: run(command="bash benchmarks/gpu_session.sh", carry=[".gpu"], timeout_s=540).
#
#   0. install .gpu/wheels (--no-deps, into a folder on PYTHONPATH) and point the harness at .gpu's ComfyUI tarball;
#   1. memory: predicted vs measured peak per phase, SD1.5, SDXL, SD3.5-M, Flux fp8 (gpu_memory.py), planned from
#      the footprints bench_memory.py probed here on the same ComfyUI (results/memory_newest.json: the probe is
#      minutes of CPU per model and gives the same bytes on any machine);
#   2. dynamic_vram: a Dynamic VRAM load of ComfyUI 0.33 trains to the plain load's LoRA gradient (gpu_dynamic_vram.py);
#   3. iteration: one iteration of tree, window GRPO and all-step GRPO through the ComfyUI path, unit costs and run
#      whole (bench_iteration.py), then every preset's iteration composed from those costs (bench_presets.py).
# Each step has its own time limit, cut to what is left of BUDGET_S; each writes its JSON into $OUT (else
# benchmarks/results/gpu) as soon as it ends, and gpu_session.json says after every step what ended how, so a
# run cut off still returns what it finished.
#
# CPU smoke run (tests/e2e/test_gpu_session.py): DEVICE=cpu LAYERS=1 PX=64 MEMORY_MODELS=sd15 HPS_ARCH=ViT-B-32
#   ITER_MODELS=sd15 ITER_PX=16 ITER_METHODS=tree DYN_HIDDEN=256 OUT=/tmp/x bash benchmarks/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-450}
DEST=${OUT:-benchmarks/results/gpu}
mkdir -p "$DEST"
SUMMARY="$DEST/gpu_session.json"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TREEGRPO_COMFYUI_LANE=newest
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}    # treegrpo/ from this checkout: nothing is installed there

record() {   # record NAME STATUS SECONDS LIMIT: add one step to gpu_session.json (rewritten whole each time)
  $PY - "$SUMMARY" "$@" <<'PY'
import json, os, sys
path, name, status, seconds, limit = sys.argv[1:6]
data = json.load(open(path)) if os.path.exists(path) else {"steps": []}
data["steps"].append({"step": name, "status": status, "seconds": int(seconds), "limit_s": int(limit)})
tmp = path + ".tmp"
json.dump(data, open(tmp, "w"), indent=1)
os.replace(tmp, path)
PY
}

step() {     # step NAME CAP command...: run it with min(CAP, what is left) seconds; skipped under 20 s
  local name=$1 cap=$2 left limit t0 rc status
  shift 2
  left=$((BUDGET_S - (SECONDS - START)))
  limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped (a limit of $limit s: $left s left of $BUDGET_S, the step's own $cap s)"
    record "$name" skipped 0 "$limit"
    return
  fi
  echo "== $name (at most $limit s)"
  t0=$SECONDS
  timeout "$limit" "$@"
  rc=$?
  case $rc in 0) status=done ;; 124|137) status=timeout ;; *) status="failed (exit $rc)" ;; esac
  echo "== $name: $status after $((SECONDS - t0)) s"
  record "$name" "$status" $((SECONDS - t0)) "$limit"
}

rm -f "$SUMMARY"
# 0. what a bare machine lacks (benchmarks/gpu_prepare.sh put it in .gpu/)
if [ -d .gpu/wheels ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/treegrpo-site .gpu/wheels/*.whl \
    || { echo "gpu_session: installing .gpu/wheels failed" >&2; record install "failed" $((SECONDS - START)) 0; exit 1; }
  export PYTHONPATH=/tmp/treegrpo-site${PYTHONPATH:+:$PYTHONPATH}
fi
ls .gpu/ComfyUI-*.tar.gz >/dev/null 2>&1 && export TREEGRPO_COMFYUI_SHARED=$PWD/.gpu
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
record install done $((SECONDS - START)) 0

LAYERS=${LAYERS:-0}
step memory "${T_MEMORY:-240}" $PY benchmarks/gpu_memory.py --device "$DEVICE" --models "${MEMORY_MODELS:-sd15,sdxl,sd35m,flux_fp8}" \
  --layers "$LAYERS" --px "${PX:-0}" --hps-arch "${HPS_ARCH:-ViT-H-14}" --out "$DEST/gpu_memory.json" \
  --footprints "${FOOTPRINTS:-benchmarks/results/memory_newest.json}"
step dynamic_vram "${T_DYNAMIC:-60}" $PY benchmarks/gpu_dynamic_vram.py --device "$DEVICE" --hidden "${DYN_HIDDEN:-3072}" \
  --out "$DEST/dynamic_vram.json"
GPU_FLAGS=()
[ "$DEVICE" = cpu ] || GPU_FLAGS=(--gpu --whole)
step iteration "${T_ITERATION:-150}" $PY benchmarks/bench_iteration.py "${GPU_FLAGS[@]}" --px "${ITER_PX:-512}" \
  --models "${ITER_MODELS:-sd15,sdxl,sd35m}" --methods "${ITER_METHODS:-tree,window_grpo,all_step_grpo}" \
  ${ITER_NO_HPS:+--no-hps} --out "$DEST/iteration_gpu.json"
if [ -f "$DEST/iteration_gpu.json" ]; then
  step presets 20 $PY benchmarks/bench_presets.py --costs "$DEST/iteration_gpu.json" --out "$DEST/presets_gpu.json"
fi
echo "gpu_session: $((SECONDS - START)) s of $BUDGET_S; results in $DEST"
