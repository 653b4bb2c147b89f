"""The prepared GPU session (``benchmarks/gpu_session.sh``) run whole on the CPU at tiny depth, as the GPU runs it:
every step ends, writes its JSON and says so in ``gpu_session.json``; a budget that is spent skips the steps it
cannot hold; the memory step plans from stored footprints exactly as from its own probe."""
import json
import os
import subprocess
import sys

import pytest

import comfy_harness as ch

SCRIPT = ch.REPO_ROOT / "benchmarks" / "gpu_session.sh"
SMOKE = dict(DEVICE="cpu", LAYERS="1", PX="64", MEMORY_MODELS="sd15", HPS_ARCH="ViT-B-32", ITER_MODELS="sd15",
             ITER_PX="16", ITER_METHODS="tree", ITER_NO_HPS="1", DYN_HIDDEN="256")


def _newest_or_skip():
    if ch.newest_tarball() is None:
        msg = f"no ComfyUI tarball in {ch.SHARED_COMFYUI}: the GPU session runs on the newest ComfyUI"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def _session(tmp_path, **env):
    out = tmp_path / "out"
    e = dict(os.environ, PY=sys.executable, OUT=str(out), OMP_NUM_THREADS="2", **env)
    p = subprocess.run(["bash", str(SCRIPT)], cwd=str(ch.REPO_ROOT), env=e, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, json.loads((out / "gpu_session.json").read_text()), p.stdout


def test_a_spent_budget_skips_every_step_and_says_so(tmp_path):
    out, summary, log = _session(tmp_path, BUDGET_S="0", **SMOKE)
    steps = {s["step"]: s["status"] for s in summary["steps"]}
    assert steps == {"install": "done", "memory": "skipped", "dynamic_vram": "skipped", "iteration": "skipped"}
    assert sorted(os.listdir(out)) == ["gpu_session.json"]
    assert "== memory: skipped" in log


@pytest.mark.slow
def test_the_gpu_session_runs_whole_on_the_cpu_at_tiny_depth(tmp_path):
    _newest_or_skip()
    out, summary, log = _session(tmp_path, **SMOKE)
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [
        ("install", "done"), ("memory", "done"), ("dynamic_vram", "done"), ("iteration", "done"),
        ("presets", "done")], log[-3000:]
    mem = json.loads((out / "gpu_memory.json").read_text())
    assert [r["model"] for r in mem] == ["sd15"]
    row = mem[0]
    assert set(row["predicted_gb"]) == {"sample", "decode", "reward", "update"}
    assert row["footprint_source"] == "probed here" and row["px"] == 64 and row["layers"] == 1
    assert all(0 < v < 24 for v in row["predicted_gb"].values())
    dyn = json.loads((out / "dynamic_vram.json").read_text())
    assert ch.newest_tarball().name == f"ComfyUI-{dyn['comfyui']}.tar.gz"   # the session runs the newest ComfyUI
    assert dyn["plain"]["update_s"] > 0 and dyn["dynamic_vram"] is False   # no dynamic patcher on a CPU
    it = json.loads((out / "iteration_gpu.json").read_text())
    assert [m["model"] for m in it["models"]] == ["sd15"] and "tree" in it["models"][0]["methods"]
    presets = json.loads((out / "presets_gpu.json").read_text())
    assert set(presets["models"]["sd15"]["presets"]) == {"fast", "balanced", "paper"}

    # the memory step again, planned from the footprint the first run probed: the same plan and the same predictions
    again = tmp_path / "again.json"
    env = dict(os.environ, OMP_NUM_THREADS="2", TREEGRPO_COMFYUI_LANE="newest")
    p = subprocess.run([sys.executable, "benchmarks/gpu_memory.py", "--device", "cpu", "--models", "sd15",
                        "--layers", "1", "--px", "64", "--hps-arch", "ViT-B-32", "--footprints",
                        str(out / "gpu_memory.json"), "--out", str(again)], cwd=str(ch.REPO_ROOT), env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    row2 = json.loads(again.read_text())[0]
    assert row2["footprint_source"] == "bench_memory.py's footprint"
    assert row2["plan"] == row["plan"] and row2["predicted_gb"] == row["predicted_gb"]
    assert row2["footprint"] == row["footprint"]
