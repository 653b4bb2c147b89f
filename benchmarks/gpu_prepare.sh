#!/usr/bin/env bash
# Run here, before a lent GPU machine is asked for: puts into .gpu/ (ignored by git) what benchmarks/gpu_session.sh
# needs there and cannot download: the wheels of benchmarks/gpu_wheels.txt for the machine's Python 3.12, and the
# newest ComfyUI tarball of ../shared/comfyui/. Then, with the device tool:
#   run(command="bash benchmarks/gpu_session.sh", carry=[".gpu"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
rm -rf .gpu && mkdir -p .gpu/wheels
grep -v '^#' benchmarks/gpu_wheels.txt | grep . | while read -r req build; do
  name=${req%%==*}
  if [ "${build:-}" = any ]; then
    platforms=(--platform any)
  else
    platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
               --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64)
  fi
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
      -d .gpu/wheels "$req" 2>/dev/null || { echo "gpu_prepare: no wheel of $req for CPython 3.12" >&2; exit 1; }
  ls .gpu/wheels | grep -qi "^${name//-/_}-" || { echo "gpu_prepare: $req not downloaded" >&2; exit 1; }
done
tarball=$(ls ../shared/comfyui/ComfyUI-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)
[ -n "$tarball" ] || { echo "gpu_prepare: no ComfyUI-<version>.tar.gz in ../shared/comfyui/" >&2; exit 1; }
cp "$tarball" .gpu/
du -sh .gpu .gpu/wheels
