"""A run left to train for hours, through a real ComfyUI server as the web UI queues it (issue: the first real run).

Starts ComfyUI's ``main.py`` (the pack in ``custom_nodes``, the tests' harness), opens a websocket as the page does,
queues the Train node of ``workflows/treegrpo_demo_cpu.json`` for ``--iterations`` iterations (evaluating every
``--eval-every``, a LoRA kept every ``--save-every``) and, while it trains, samples the server process's resident
memory every ``--sample-s`` seconds. Reports what grows with the run's length:

- **memory**: the server's RSS (MB) after the first tenth of the run and at the end, and the least-squares slope of
  RSS over the second half, in MB per 1000 iterations (a leak grows it; a steady run stays within the allocator's
  noise);
- **time**: the median s/iteration (the trainer's own ``t_iter`` in ``log.json``) over the first and the last tenth
  of the run (work that scales with the history slows the last tenth);
- **disk**: files and bytes in the run folder and the LoRA folder, per 1000 iterations;
- **messages**: websocket messages the page received, per iteration;
- **warnings**: the evaluations that fail a reward-hacking check, and the warning and "passed" lines the server's
  console printed (a check is said when it starts failing, not at every evaluation).

Usage: ``python benchmarks/bench_soak.py [--iterations 2000] [--eval-every 20] [--save-every 0]
[--out benchmarks/results/soak.json]``
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from treegrpo.io import atomic_write_json  # noqa: E402

ITER_LINE = re.compile(r"TreeGRPO (\S+): it (\d+)/(\d+) ")


def demo_prompt(port: int, run_name: str, iterations: int, eval_every: int, save_every: int) -> dict:
    """The demo workflow in API format, converted with the node definitions the server lists (as the page does),
    with the Train node's run length changed (the rest as shipped)."""
    import comfy_harness as ch

    api = ch.workflow_to_api(json.loads((ROOT / "workflows" / "treegrpo_demo_cpu.json").read_text()),
                             ch.node_classes_from_server(port))
    for node in api.values():
        if node["class_type"] == "TreeGRPOTrain":
            node["inputs"].update(iterations=iterations, eval_every=eval_every, save_every=save_every,
                                  run_name=run_name, existing_run="overwrite")
    return api


def slope_per_1000(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x, times 1000 (points: (iteration, MB))."""
    if len(points) < 2:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")


def folder_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    n = b = 0
    for p in path.rglob("*"):
        if p.is_file():
            n, b = n + 1, b + p.stat().st_size
    return n, b


def run(ns) -> dict:
    import psutil

    import comfy_harness as ch

    base = Path(ns.workdir or tempfile.mkdtemp(prefix="bench_soak-"))
    run_name = "soak"
    srv = ch.start_server(base / "server")
    samples: list[tuple[float, int, float]] = []   # (t, iteration, RSS MB)
    stop = threading.Event()
    proc = psutil.Process(srv.pid)
    seen = [0]

    def watch():
        pos = 0
        while not stop.is_set():
            try:
                with open(srv.log_path, "rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos += len(chunk)
                for m in ITER_LINE.finditer(chunk.decode(errors="replace")):
                    if m.group(1) == run_name:
                        seen[0] = max(seen[0], int(m.group(2)))
                samples.append((time.monotonic(), seen[0], proc.memory_info().rss / 2**20))
            except (psutil.Error, OSError):
                pass
            stop.wait(ns.sample_s)

    t0 = time.monotonic()
    try:
        api = demo_prompt(srv.port, run_name, ns.iterations, ns.eval_every, ns.save_every)
        with ch.EventClient(srv.port) as client:
            th = threading.Thread(target=watch, daemon=True)
            th.start()
            pid = ch.post_prompt(srv.port, api, client_id=client.client_id)
            entry = ch.wait_history(srv.port, pid, timeout=ns.timeout_s, check=True)
            stop.set()
            th.join()
            messages = len(client.events)
    finally:
        stop.set()
        srv.stop()
    wall = time.monotonic() - t0
    console = Path(srv.log_path).read_text(errors="replace")
    n = ns.iterations
    out_dir, lora_dir = base / "server" / "output" / "treegrpo" / run_name, base / "server" / "models" / "loras" / \
        "treegrpo" / run_name
    run_files, run_bytes = folder_size(out_dir)
    lora_files, lora_bytes = folder_size(lora_dir)
    tenth = max(1, n // 10)
    after_warmup = [s for s in samples if s[1] >= tenth]
    second_half = [(it, mb) for _, it, mb in samples if n // 2 <= it < n]

    log = json.loads((out_dir / "log.json").read_text())
    t_iter = [h["t_iter"] for h in log["train"]]
    return {
        "workdir": str(base), "iterations": n, "eval_every": ns.eval_every, "save_every": ns.save_every,
        "status": entry["status"]["status_str"],
        "wall_s": wall, "samples": len(samples),
        "rss_mb": {"after_first_tenth": after_warmup[0][2] if after_warmup else None,
                   "end": samples[-1][2] if samples else None, "peak": max(s[2] for s in samples) if samples else None,
                   "slope_second_half_per_1000_it": slope_per_1000(second_half)},
        "s_per_it_median": {"first_tenth": statistics.median(t_iter[:tenth]),
                            "last_tenth": statistics.median(t_iter[-tenth:])},
        "run_folder": {"files": run_files, "bytes": run_bytes, "bytes_per_1000_it": 1000 * run_bytes / n},
        "lora_folder": {"files": lora_files, "bytes": lora_bytes},
        "evaluations": len(log["eval"]), "logged_iterations": len(log["train"]),
        "eval_reward": [log["eval"][0]["eval_reward"], log["eval"][-1]["eval_reward"]],
        "warnings": {"evaluations_failing_a_check": sum(1 for e in log["eval"] if e.get("warnings")),
                     "console_warning_lines": len(re.findall(r"TreeGRPO .+ warning \(iteration \d+\)", console)),
                     "console_passed_lines": len(re.findall(r"has passed its check at the last", console))},
        "ws_messages": messages, "ws_messages_per_it": messages / n,
        "rss_trace": [(it, round(mb, 1)) for _, it, mb in samples[:: max(1, len(samples) // 200)]],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--sample-s", type=float, default=1.0, help="seconds between RSS samples")
    ap.add_argument("--timeout-s", type=float, default=6 * 3600)
    ap.add_argument("--workdir", help="the server's folder (default: a new temporary one, kept for inspection)")
    ap.add_argument("--out", default=str(HERE / "results" / "soak.json"))
    ns = ap.parse_args(argv)
    res = run(ns)
    r, t = res["rss_mb"], res["s_per_it_median"]
    print(f"{res['iterations']} iterations, {res['wall_s']:.0f} s, {res['status']}; "
          f"the server's folder: {res['workdir']}")
    print(f"RSS MB: after the first tenth {r['after_first_tenth']:.0f}, end {r['end']:.0f}, peak {r['peak']:.0f}; "
          f"slope over the second half {r['slope_second_half_per_1000_it']:+.1f} MB / 1000 it")
    print(f"s/it (median): first tenth {t['first_tenth']:.3f}, last tenth {t['last_tenth']:.3f}")
    print(f"run folder: {res['run_folder']['files']} files, {res['run_folder']['bytes'] / 2**20:.1f} MB; "
          f"LoRA folder: {res['lora_folder']['files']} files, {res['lora_folder']['bytes'] / 2**20:.1f} MB; "
          f"{res['evaluations']} evaluations; {res['ws_messages_per_it']:.1f} websocket messages / it")
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    atomic_write_json(ns.out, res)
    print(f"wrote {ns.out}")
    return 0 if res["status"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
