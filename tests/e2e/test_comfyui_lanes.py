"""The second ComfyUI lane: every real-ComfyUI test (those marked ``comfyui``: in-process, server, families,
gradients, browser) again on the newest ComfyUI tree in ``../shared/comfyui/`` (0.33.0 today; a newer tarball there
replaces it, the version is read from the tree). ComfyUI is a process-wide singleton, so the lane is a second pytest
process with ``TREEGRPO_COMFYUI_LANE=newest``; its log is kept in ``.cache/comfyui-lanes/``.

Without ``../shared`` (a user's clone) the lane is skipped with one line; with ``CI`` set it fails instead."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import comfy_harness as ch

LOG_DIR = ch.REPO_ROOT / ".cache" / "comfyui-lanes"


@pytest.mark.skipif(ch.lane() == "newest", reason="this process is the newest lane itself")
def test_every_comfyui_test_passes_on_the_newest_comfyui():
    tarball = ch.newest_tarball()
    if tarball is None:
        msg = f"no ComfyUI tarball in {ch.SHARED_COMFYUI}: the newest-ComfyUI lane did not run"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{tarball.name.removesuffix('.tar.gz')}.log"
    env = dict(os.environ, **{ch.LANE_ENV: "newest"})
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "comfyui", "-p", "no:cacheprovider", "-o", "addopts=-rfE",
           str(Path(__file__).resolve().parents[1])]
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=str(ch.REPO_ROOT), env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    text = log.read_text(errors="replace")
    summary = [ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR")) or " passed" in ln
               or " failed" in ln]
    print(f"newest lane ({tarball.name}): " + (summary[-1] if summary else "no summary") + f" (log: {log})")
    assert rc == 0, f"the ComfyUI tests fail on {tarball.name} (rc {rc}; log {log}):\n" + "\n".join(summary[-60:])
