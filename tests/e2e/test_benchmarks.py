"""The benchmarks' harness (benchmarks/harness.py: registry, child runs, paired statistics), its time-to-reach
arithmetic, and each benchmark end to end on tiny runs."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_methods as bm  # noqa: E402
import harness as h  # noqa: E402


def _evals(pts):
    return [{"train_time": t, "total_nfe": 100 * t, "iteration": t / 4, "eval_reward": r, "eval_diversity": 0.1}
            for t, r in pts]


def test_time_to_reach_interpolates_and_reports_nan_when_never_reached():
    ev = _evals([(0, 0.5), (10, 0.4), (20, 0.6), (30, 0.7)])
    assert h.time_to_reach(ev, 0.55) == pytest.approx(17.5)      # the first crossing, 0.4 → 0.6
    assert h.time_to_reach(ev, 0.55, "total_nfe") == pytest.approx(1750)
    assert h.time_to_reach(ev, 0.5) == 0                         # reached at the start
    assert math.isnan(h.time_to_reach(ev, 0.8))
    assert h.reward_at(ev, 25) == pytest.approx(0.65)
    assert h.mean_std([1.0, 3.0, math.nan]) == (2.0, pytest.approx(math.sqrt(2)), 2)


def test_result_files_are_standard_json():
    """A ratio no seed reached is NaN in memory and null in the file (``NaN`` is not JSON: jq and browsers refuse
    it); the runs' records, which --merge and --collect compute from, are written as they are."""
    res = h.json_ready({"result": {"ratio": math.nan, "by_seed": {"0": 0.5, "1": math.inf}, "xs": [1.0, -math.inf]},
                        "n": 3, "records": [{"kl": math.nan}]})
    assert res["result"] == {"ratio": None, "by_seed": {"0": 0.5, "1": None}, "xs": [1.0, None]} and res["n"] == 3
    assert math.isnan(res["records"][0]["kl"])
    strict = json.dumps({k: v for k, v in res.items() if k != "records"}, allow_nan=False)
    assert json.loads(strict)["result"]["ratio"] is None


def _rec(method, seed, pts, t_iter):
    return {"method": method, "seed": seed, "evals": _evals(pts), "iterations": 10, "peak_rss_mb": 1.0,
            "split": {"t_sample": 0.0, "t_decode": 0.0, "t_reward": 0.0, "t_update": 0.0, "t_iter": t_iter}}


def test_report_ratios_against_the_baseline():
    recs = [_rec("base", 0, [(0, 0.5), (40, 0.7)], 2.0), _rec("base", 1, [(0, 0.5), (40, 0.7)], 2.0),
            _rec("fast", 0, [(0, 0.5), (10, 0.7)], 1.0), _rec("fast", 1, [(0, 0.5), (20, 0.7)], 1.0)]
    out = bm.report(recs, baseline="base")["methods"]
    assert out["fast"]["time_to_baseline_ratio"][:2] == (pytest.approx(0.375), pytest.approx(math.sqrt(2) * 0.125))
    assert out["fast"]["iteration_time_ratio"] == pytest.approx(0.5)
    assert out["base"]["time_to_baseline_ratio"][0] == pytest.approx(1.0)
    assert out["fast"]["t50_s"][0] == pytest.approx(7.5)         # half the baseline's gain: 5 s and 10 s
    assert out["fast"]["it50"][0] == pytest.approx(7.5 / 4)       # the same crossings in iterations (4 s each)


def test_merge_pools_the_seeds_of_two_runs(tmp_path):
    """--merge: seeds 0-1 from one methods.json and 2-3 from another give one report over all four."""
    names = ("traj_window", "traj_all", "traj_window_mirrored", "tree")
    parts = []
    for first in (0, 2):
        recs = [_rec(m, first + i, [(0, 0.5), (40 if m.startswith("traj") else 10 * (first + 1), 0.7)],
                     2.0 if m.startswith("traj") else 1.0) for i in range(2) for m in names]
        path = tmp_path / f"part{first}.json"
        path.write_text(json.dumps({"records": recs, "budget_s": 40.0, "lr": 3e-3, "parallel_runs": 2,
                                    "window_width": 3}))
        parts.append(str(path))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_methods.py"), "--merge", *parts,
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "out" / "methods.json"))
    assert len(res["records"]) == 16 and sorted({x["seed"] for x in res["records"]}) == [0, 1, 2, 3]
    tree = res["main"]["methods"]["tree"]
    # seeds 0-1 reach the baseline's 0.7 at 10 s, seeds 2-3 at 30 s, of the baseline's 40 s
    assert tree["time_to_baseline_ratio"][0] == pytest.approx(0.5) and tree["time_to_baseline_ratio"][2] == 4
    assert res["vs_window_mirrored"]["baseline"] == "traj_window_mirrored" and res["budget_s"] == 40.0
    assert "vs_awm" not in res     # only the peers that ran are targets
    assert (tmp_path / "out" / "reward_vs_time.png").exists()


def test_a_run_whose_record_outgrows_the_pipe_does_not_block():
    """run_child reads a child's whole output before it waits: a 300 kB record (a long run's, past the 64 KiB pipe
    buffer) comes back whole with the child's status and its own peak RSS; a failing child's status is kept."""
    code = "import json, sys; sys.stdout.write('x' * 300000 + chr(10) + json.dumps({'ok': 1}) + chr(10))"
    out, status, usage = h.run_child([sys.executable, "-c", code])
    assert status == 0 and len(out) == 300000 + 11 and json.loads(out.strip().splitlines()[-1]) == {"ok": 1}
    assert usage.ru_maxrss > 0
    _, status, _ = h.run_child([sys.executable, "-c", "raise SystemExit(3)"])
    assert os.waitstatus_to_exitcode(status) == 3


def test_one_tiny_comparison_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_methods.py"), "--seeds", "1",
                        "--budget", "1.5", "--only", "tree", "--only", "traj_window", "--first-seed", "3",
                        "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "explore.json"))
    by = {x["method"]: x for x in res["records"]}
    assert set(by) == {"tree", "traj_window"} and {x["seed"] for x in res["records"]} == {3}
    assert by["tree"]["nfe_per_iter"] == 24 * (1 + 7 + 8 * 2)       # prefix + window + 2-step tail, 24 prompts
    assert by["traj_window"]["nfe_per_iter"] == 24 * (1 + 1 + 8 * 2 + 8 * 2)
    for x in by.values():
        assert x["iterations"] >= 1 and x["evals"][0]["iteration"] == 0 and x["evals"][-1]["iteration"] == x["iterations"]
    assert "tree" in r.stdout and "traj_window" in r.stdout
    prov = res["provenance"]                 # how it was made: the command, commit, machine, each method's config
    assert "--budget" in prov["command"] and prov["torch"] and prov["cpu_count"] >= 1
    assert prov["configs"]["traj_window"]["tree"]["method"] == "trajectory" and "base" in prov["configs"]


def test_the_flow_matching_peers_run_in_the_same_protocol(tmp_path):
    """NFT on 8 independent DPM++(2M) samples per prompt (6 calls each, a tree leaf's path) and AWM on the tree's
    leaves, side by side with the same budget, prompts and evaluation; a per-method lr sweep writes its own file."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_methods.py"), "--seeds", "1",
                        "--budget", "1.5", "--only", "nft", "--only", "tree_awm", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    by = {x["method"]: x for x in json.load(open(tmp_path / "explore.json"))["records"]}
    assert by["nft"]["nfe_per_iter"] == 24 * 8 * h.PEER_ODE_STEPS
    assert by["tree_awm"]["nfe_per_iter"] == 24 * (1 + 7 + 8 * 2)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_methods.py"), "--seeds", "1",
                        "--budget", "1", "--lr-sweep", "1e-3,4e-3", "--lr-sweep-method", "awm", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = json.load(open(tmp_path / "lr_sweep_awm.json"))
    assert {x["method"] for x in sweep["records"]} == {"awm_lr1e-3", "awm_lr4e-3"}


def test_base_config_runs_the_baselines_on_a_diffusers_model(tmp_path):
    """--base-config (the GPU path) on a tiny SD1.x folder: the all-step baseline stops before the noiseless
    last DDIM step, and every method trains through the diffusers backend."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from diffusers_fixtures import save_pipeline

    folder = save_pipeline("sd", str(tmp_path / "sd"))
    base = {"backend": "diffusers", "model": folder, "prompts": ["a red circle", "a blue square"], "cfg": 2.0,
            "rewards": [{"name": "jpeg_compressibility", "weight": 1.0}], "pipeline": {"height": 16, "width": 16},
            "tree": {"steps": 4, "window_start": 1, "window_width": 2, "branch": 2}, "lora": {"rank": 4, "alpha": 8.0},
            "prompts_per_iter": 2, "device": "cpu"}
    cfg_path = tmp_path / "base.json"
    cfg_path.write_text(json.dumps(base))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_methods.py"), "--base-config",
                        str(cfg_path), "--seeds", "1", "--budget", "0.5", "--only", "traj_window", "--only", "tree",
                        "--only", "traj_all", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    by = {x["method"]: x for x in json.load(open(tmp_path / "out" / "explore.json"))["records"]}
    # 2 prompts × 2 (cfg > 1: cond + uncond evaluations, batched); tree: 1 + (1 + 2) + 4 leaves × 1 tail step
    assert by["tree"]["nfe_per_iter"] == 2 * 2 * (1 + 3 + 4 * 1)
    assert by["traj_window"]["nfe_per_iter"] == 2 * 2 * (1 + 1 + 4 * 1 + 4 * 1)
    assert by["traj_all"]["nfe_per_iter"] == 2 * 2 * (1 + 4 * 2 + 4 * 1)   # SDE on steps 0..2, the last step ODE


def test_on_a_users_config_nft_and_awm_sample_its_schedule_at_its_lr_unless_told():
    """--base-config: the peers took the demo's lr (1.2e-2, tuned on its 330K-parameter model: 120x a real model's
    GRPO lr) and 6-step samples; now their samples are as long as the config's tree leaves' paths and their lr is
    the config's, or --peer-lr."""
    base = {"tree": {"steps": 16, "window_start": 2, "window_width": 3, "branch": 2}, "optim": {"lr": 1e-4}}
    p = h.protocol(base_config=base)
    for name in ("nft", "awm"):
        assert p.overrides(name)["optim"]["lr"] == 1e-4 and p.overrides(name)["tree"]["tail_steps"] == 16
    assert p.overrides("tree_nft")["optim"]["lr"] == 1e-4
    with_tail = h.protocol(base_config={**base, "tree": {**base["tree"], "tail_steps": 4}}, peer_lr=3e-4)
    assert with_tail.overrides("awm")["tree"]["tail_steps"] == 2 + 3 + 4
    assert {with_tail.overrides(n)["optim"]["lr"] for n in h.PEERS} == {3e-4}
    assert "lr" not in h.protocol(base_config=base).overrides("tree").get("optim", {})    # the config's own
    assert h.DEMO.overrides("nft")["optim"]["lr"] == h.PEER_LR                            # the demo: as measured


def test_on_a_users_config_every_method_is_a_valid_config():
    """A config with tree-only settings (a sliding window, a leaf cap, mirrored siblings, a branch schedule) still
    gives every method a config it accepts: the baselines and the ODE peers do not inherit the tree's shape."""
    from treegrpo.config import TrainConfig

    base = {"prompts": ["a"], "tree": {"steps": 16, "window_start": 2, "window_width": 3, "branch": 2,
                                       "branch_schedule": [4, 2, 2], "leaf_cap": 12, "antithetic": True,
                                       "window_schedule": "sliding", "window_max_start": 6}}
    p = h.protocol(base_config=base)
    for name in p.methods:
        cfg = TrainConfig.from_dict(p.config_dict(p.overrides(name)))
        assert cfg.tree.leaves == 12, name


def test_the_registry_is_read_only_and_another_protocol_builds_its_own():
    """harness.py's registry: a lookup is a fresh copy (changing it changes nothing registered), a protocol with
    more steps is built beside the demo's without editing it (the window at the same noise level, the all-step
    baseline and the peers' samples as long as the schedule), an unknown name is refused naming the known ones, and
    NAME=JSON is a new configuration's changes."""
    tree = h.DEMO.overrides("tree")
    tree["tree"]["antithetic"] = False
    assert h.DEMO.overrides("tree")["tree"]["antithetic"] is True and h.METHODS["tree"]["tree"]["antithetic"] is True
    with pytest.raises(TypeError):
        h.METHODS["mine"] = {}
    t40 = h.protocol(steps=40, tail="schedule")
    assert t40.base["tree"]["steps"] == 40 and t40.base["tree"]["window_start"] == 4
    assert t40.overrides("traj_all")["tree"]["window_width"] == 40 and t40.overrides("awm")["tree"]["tail_steps"] == 40
    assert h.DEMO.base["tree"]["steps"] == 10 and h.DEMO.overrides("traj_all")["tree"]["window_width"] == 10
    with pytest.raises(SystemExit, match="unknown configuration 'trees'.*tree_p12"):
        h.DEMO.overrides("trees")
    assert h.DEMO.resolve('mine={"tree": {"branch": 3}}') == ("mine", {"tree": {"branch": 3}})
    assert h.split_items('tree,mine={"tree": {"a": 1, "b": 2}},awm') == ["tree", 'mine={"tree": {"a": 1, "b": 2}}', "awm"]
    with pytest.raises(SystemExit, match="does not fit"):
        h.protocol(steps=3)


def test_bench_comfy_runs_the_demo_workflow_through_comfyui_and_the_cli(comfyui_pack, tmp_path):
    """benchmarks/bench_comfy.py end to end, shortened: the shipped demo workflow's Train node in the real
    ComfyUI and the same settings through the CLI trainer, paired per seed."""
    import bench_comfy

    out = tmp_path / "comfy.json"
    assert bench_comfy.main(["--iterations", "2", "--set", "prompts_per_iteration=3", "--set", "eval_every=1",
                             "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    run = res["runs"][0]
    assert run["comfy"]["iterations"] == run["cli"]["iterations"] == 2
    assert len(run["comfy"]["eval"]) == len(run["cli"]["eval"]) == 3
    assert run["comfy"]["base_reward"] == pytest.approx(run["cli"]["base_reward"], abs=0.05)  # same base model
    assert run["time_per_iteration_ratio"] > 0 and res["summary"]["seeds_with_gain_at_least_0.12"] in (0, 1)


def test_bench_memory_measures_a_published_architecture_on_fake_tensors(comfyui_pack):
    """benchmarks/bench_memory.py on SD1.5 at 512 px (its real size: fake tensors cost no memory): the weights are
    the published model's (860 M parameters in fp16 = 1.72 GB), checkpointing lowers the update's peak, the plan
    fits the issue's 8 GB target, and the README table renders."""
    import bench_memory

    r = bench_memory.measure("sd15")
    assert 1.6 < r["weights_gb"]["denoiser"] < 1.8 and r["weights_gb"]["rewards"] > 1.9   # HPS: ViT-H-14 in fp16
    assert max(r["checkpointing"].values()) < max(r["no_checkpointing"].values()) / 2
    assert r["smallest"]["peak_gb"] <= 8 and r["plans"]["8"].startswith("planned peak")
    table = bench_memory.markdown({"models": [r]})
    assert "SD1.5 @ 512" in table and "✓" in table


def test_bench_hacking_sweeps_kl_and_reports_the_held_out_judge(tmp_path):
    """benchmarks/bench_hacking.py end to end, shortened: two kl_beta values, one seed, the table and the merge."""
    import bench_hacking

    out = tmp_path / "hacking.json"
    res = bench_hacking.main(["--kl", "0,0.1", "--seeds", "1", "--iterations", "2", "--eval-every", "1",
                              "--out", str(out)])
    assert set(res["by_kl"]) == {"0.0", "0.1"} and res["best_kl_beta"] in (0.0, 0.1)
    run = res["runs"][0]
    assert [p["iteration"] for p in run["curve"]] == [0, 1, 2]
    assert run["base"]["hf_ratio"] == 1.0 and run["base"]["diversity_ratio"] == 1.0
    assert (tmp_path / "hacking.png").exists()
    merged = bench_hacking.main(["--kl", "1", "--seeds", "1", "--iterations", "2", "--eval-every", "1",
                                 "--out", str(out), "--merge"])
    assert set(merged["by_kl"]) == {"0.0", "0.1", "1.0"} and len(merged["runs"]) == 3
    assert "| 1.0 |" in bench_hacking.markdown(merged)


def test_paired_ratios_take_each_seeds_target_from_the_same_seeds_baseline():
    """Per seed: the time to that seed's baseline final reward over that baseline run's time; a seed that never
    gets there is NaN and not counted as reached."""
    recs = [_rec("base", 0, [(0, 0.5), (40, 0.6)], 2.0), _rec("base", 1, [(0, 0.5), (40, 0.8)], 2.0),
            _rec("fast", 0, [(0, 0.5), (10, 0.7)], 1.0), _rec("fast", 1, [(0, 0.5), (10, 0.7)], 1.0)]
    by_seed = bm.paired_time_ratios([r for r in recs if r["method"] == "fast"], [r for r in recs if r["method"] == "base"])
    assert by_seed[0] == pytest.approx(5 / 40) and math.isnan(by_seed[1])   # 0.6 at 5 s; 0.8 never
    out = bm.report(recs, baseline="base")["methods"]["fast"]
    assert out["time_to_baseline_paired"][0] == pytest.approx(0.125) and out["reached_baseline_paired"] == "1/2"


def test_steps_keep_the_window_at_the_same_noise_level_and_the_nfe_matches_the_closed_form(tmp_path):
    """bench_steps / bench_methods --steps: at T = 40 the window starts at step 4 (σ = 0.9, as step 1 at T = 10),
    w = 3 (8 leaves, 8 trajectories); the closed form gives the NFE per prompt for both tails; a short run of each
    T counts exactly that many calls."""
    import bench_steps

    tree = bench_steps.method_config("tree", 40, "schedule", 24)
    assert tree.tree.window_start == 4 and tree.tree.window_width == 3 and tree.tree.tail_steps == 0
    assert bench_steps.predicted_nfe(tree) == 24 * (4 + 7 + 8 * 33)
    assert bench_steps.predicted_nfe(bench_steps.method_config("traj_window", 40, "schedule", 24)) == 24 * (4 + 17 + 8 * 33)
    assert bench_steps.predicted_nfe(bench_steps.method_config("tree", 20, "fixed", 24)) == 24 * (2 + 7 + 8 * 2)
    allstep = bench_steps.method_config("traj_all", 20, "fixed", 24)
    assert allstep.tree.window_width == 20 and bench_steps.trained_parents(allstep) == 1 + 8 * 19
    awm = bench_steps.method_config("awm", 40, "fixed", 24)
    assert awm.tree.tail_steps == 4 + 3 + 2 and bench_steps.predicted_nfe(awm) == 24 * 8 * 9
    assert bench_steps.trained_parents(bench_steps.method_config("tree", 10, "fixed", 24)) == 7
    for steps, tail, name in ((20, "fixed", "tree"), (20, "schedule", "traj_window")):
        r = bench_steps.measure_cost(name, steps, tail, iterations=2, prompts=2, out=str(tmp_path / name))
        assert r["nfe"] == r["nfe_predicted"] and r["t_iter"] > 0
    with pytest.raises(SystemExit, match="--tail"):
        bench_steps.method_config("tree", 10, "long", 24)


def test_collect_puts_each_steps_run_in_one_table(tmp_path):
    """bench_steps --collect: one row per (T, method) from each folder's explore.json or methods.json, the paired
    ratio against the same T's window baseline, and the closed-form NFE ratio from cost.json."""
    import bench_steps

    for steps, t_tree in ((10, 10), (40, 30)):
        recs = [_rec(m, s, [(0, 0.5), (t_tree if m == "tree" else 40, 0.7)], 1.0 if m == "tree" else 2.0)
                for s in (0, 1) for m in ("traj_window", "tree")]
        d = tmp_path / f"T{steps}"
        d.mkdir()
        (d / ("explore.json" if steps == 40 else "methods.json")).write_text(
            json.dumps({"records": recs, "steps": steps, "tail": "fixed"}))
    cost = {"records": [{"steps": t, "tail": "fixed", "method": m, "nfe_predicted": n}
                        for t in (10, 40) for m, n in (("tree", 24), ("traj_window", 34))]}
    rows = bench_steps.collect([str(tmp_path / "T10"), str(tmp_path / "T40")], cost, ("tree", "traj_window"))["rows"]
    tree = {r["steps"]: r for r in rows if r["method"] == "tree"}
    assert tree[10]["time_to_baseline_paired"][0] == pytest.approx(0.25) and tree[40]["reached"] == "2/2"
    assert tree[40]["time_to_baseline_paired"][0] == pytest.approx(0.75)
    assert tree[10]["nfe_ratio_closed_form"] == pytest.approx(24 / 34) and tree[10]["iteration_time_ratio"] == 0.5
    assert "| 40 | tree |" in bench_steps.steps_table(rows)


def test_smoothed_curves_average_consecutive_evaluations_and_keep_the_start():
    """A moving average over 3 evaluations, time included (each point at the mean time of its evaluations); the base
    model's evaluation stays the start; width 1 is the raw curve."""
    ev = _evals([(0, 0.5), (2, 0.8), (4, 0.5), (6, 0.8), (8, 0.5)])
    sm = h.smooth_evals(ev, 3)
    assert [e["train_time"] for e in sm] == [0, 2, 4, 6]
    assert [e["eval_reward"] for e in sm] == [0.5, pytest.approx(0.6), pytest.approx(0.7), pytest.approx(0.6)]
    assert sm[1]["total_nfe"] == pytest.approx(200) and sm[0] is ev[0]
    short = ev[:3]
    assert h.smooth_evals(ev, 1) is ev and h.smooth_evals(short, 3) is short


def test_one_noisy_evaluation_neither_sets_the_target_nor_crosses_it():
    """Raw, a baseline whose last evaluation spikes sets a target no other run reaches, and a run whose one
    evaluation spikes early 'reaches' it there; averaged over 3 evaluations both read the trend."""
    base = [(t, 0.5 + 0.002 * t) for t in range(0, 41, 2)]
    base[-1] = (40, 0.65)                                     # trend 0.58 at 40 s, one evaluation at 0.65
    fast = [(t, 0.5 + 0.004 * t) for t in range(0, 41, 2)]   # the trend reaches 0.58 at 20 s
    fast[3] = (6, 0.66)                                       # one spike at 6 s
    recs = [_rec("base", 0, base, 2.0), _rec("fast", 0, fast, 1.0)]
    raw = bm.report(recs, baseline="base")["methods"]["fast"]["time_to_baseline_paired_by_seed"][0]
    smooth = bm.report(recs, baseline="base", smooth=3)["methods"]["fast"]["time_to_baseline_paired_by_seed"][0]
    assert raw == pytest.approx((4 + 2 * (0.65 - 0.516) / (0.66 - 0.516)) / 40)      # crossed at the spike
    # smoothed: the baseline ends at mean(0.576, 0.578, 0.65) = 0.6013 at 38 s; fast's trend gets there at 25.3 s
    target = (0.576 + 0.576 + 0.65) / 3
    assert smooth == pytest.approx((target - 0.5) / 0.004 / 38, rel=0.02)
    assert smooth > 0.6


def test_merge_refuses_runs_evaluated_at_different_cadences(tmp_path):
    parts = []
    for i, evals in enumerate((8, 32)):
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps({"records": [_rec("traj_window", i, [(0, 0.5), (40, 0.7)], 2.0)], "budget_s": 40.0,
                                    "lr": 3e-3, "parallel_runs": 2, "window_width": 3, "evals": evals}))
        parts.append(str(path))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_methods.py"), "--merge", *parts,
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode != 0 and "different cadences" in r.stderr


def test_the_ratio_to_the_baselines_best_reward_uses_its_peak_time():
    """A baseline that peaks at 20 s and falls back: the run's time to that peak over 20 s, not over its budget."""
    recs = [_rec("base", 0, [(0, 0.5), (20, 0.7), (40, 0.6)], 2.0), _rec("fast", 0, [(0, 0.5), (10, 0.7)], 1.0),
            _rec("slow", 0, [(0, 0.5), (40, 0.65)], 1.0), _rec("base", 1, [(0, 0.5), (40, 0.5)], 2.0),
            _rec("fast", 1, [(0, 0.5), (10, 0.7)], 1.0)]
    best = bm.paired_best_ratios([r for r in recs if r["method"] == "fast"], [r for r in recs if r["method"] == "base"])
    assert best[0] == pytest.approx(10 / 20) and math.isnan(best[1])     # seed 1's baseline never rose
    # first passage: the baseline first reached its final 0.6 at 10 s (on the way up), fast at 5 s
    first = bm.paired_first_passage_ratios([recs[1]], [recs[0]])
    assert first[0] == pytest.approx(5 / 10)
    out = bm.report(recs, baseline="base")["methods"]
    assert out["fast"]["time_to_baseline_paired_by_seed"][0] == pytest.approx(5 / 40)   # its final 0.6 at 5 s
    assert out["slow"]["reached_baseline_best_paired"] == "0/1"


def test_bench_artist_counts_answers_to_the_taste(tmp_path):
    """benchmarks/bench_artist.py: first passage in answers on a hand-made curve, the paired ratios (an upper bound
    where the second strategy never reached the target), and one short run of every strategy: every tree asked
    gives 2 answers per iteration, D3PO-style pairs are 2 leaves from one noise, the taste model asks during its
    warm-up, the oracle answers nothing."""
    import bench_artist as ba

    curve = [(0, 0.30), (2, 0.33), (4, 0.41), (6, 0.38)]
    assert ba.first_passage(curve, 0.1) == 4
    assert math.isnan(ba.first_passage(curve, 0.2))
    assert ba.gain_at(curve, 3) == pytest.approx(0.11)
    runs = [{"strategy": "oracle", "seed": 0, "curve": [(0, 0.3), (1, 0.7)], "answers": 0},
            {"strategy": "every", "seed": 0, "curve": [(0, 0.3), (10, 0.5), (20, 0.7)], "answers": 20, "ask_rate": 1.0},
            {"strategy": "unsure", "seed": 0, "curve": [(0, 0.3), (4, 0.4), (5, 0.6)], "answers": 5, "ask_rate": 0.3,
             "fit_s": 0.01, "agreement": [(5, 0.8)]},
            {"strategy": "d3po", "seed": 0, "curve": [(0, 0.3), (40, 0.35)], "answers": 40, "ask_rate": 1.0}]
    rep = ba.report(runs)                                    # target: 0.7 * 0.4 = 0.28 of gain
    assert rep["strategies"]["every"]["answers_to_target"]["values"] == [20.0]
    assert rep["ratios"]["unsure/every"]["values"] == [pytest.approx(5 / 20)]
    assert rep["ratios"]["every/d3po"]["values"] == [pytest.approx(20 / 40)] and rep["ratios"]["every/d3po"]["bounded"] == 1
    # below the base: every run whose end is under its start; "by more than 2 SE" counts only those the paired
    # evaluation places there (SE of the per-noise differences: std([1, 2, 3]) / √3)
    assert ba.paired_se(torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3)) == pytest.approx(1 / math.sqrt(3))
    lows = [{"strategy": "every", "seed": s, "curve": [(0, 0.41), (20, v)], "answers": 20, "ask_rate": 1.0,
             "end_se": 0.01} for s, v in ((0, 0.408), (1, 0.36), (2, 0.5))]
    low = ba.report(lows)["strategies"]["every"]
    assert low["below_base"] == 2 and low["below_base_2se"] == 1 and low["worst_vs_base"] == pytest.approx(-0.05)
    out = ba.main(["--seeds", "1", "--iterations", "3", "--warmup", "2", "--out", str(tmp_path / "artist.json")])
    by = {r["strategy"]: r for r in out["runs"]}
    assert all(math.isfinite(r["end_se"]) and r["end_se"] >= 0 for r in out["runs"])
    # the paired end evaluation: the base side is the model with its LoRA off, the same for every strategy
    ends = [r["end_eval"] for r in out["runs"]]
    assert all(e["n"] == ba.END_N and e["base"] == ends[0]["base"] and e["se"] >= 0 for e in ends)
    rep = out["report"]["strategies"]["every"]["end_eval"]
    assert rep["diff"]["values"] == [pytest.approx(by["every"]["end_eval"]["end"] - ends[0]["base"])]
    assert set(by) == set(ba.STRATEGIES)
    assert [n for n, _ in by["every"]["curve"]] == [0, 2, 4, 6] and by["d3po"]["answers"] == 6
    assert by["oracle"]["answers"] == 0 and 2 <= by["unsure"]["answers"] <= 6
    assert by["oracle"]["curve"][-1][1] > by["oracle"]["curve"][0][1]      # trained on big shapes: bigger shapes
    assert json.load(open(tmp_path / "artist.json"))["report"]["target_fraction"] == 0.7


def test_bench_artist_merge_runs_one_strategy_longer_against_the_same_target(tmp_path):
    """--merge pools results files, a later file's run replacing the same strategy and seed: D3PO-style pairs run
    again for more answers reach the target the 40-iteration oracle set (70 % of its +0.4), and the every/d3po ratio
    becomes a measured one instead of an upper bound."""
    import bench_artist as ba

    first = {"iterations": 2, "runs": [
        {"strategy": "oracle", "seed": 0, "curve": [(0, 0.3), (0, 0.5), (0, 0.7)], "answers": 0},
        {"strategy": "every", "seed": 0, "curve": [(0, 0.3), (10, 0.5), (20, 0.7)], "answers": 20, "ask_rate": 1.0},
        {"strategy": "d3po", "seed": 0, "curve": [(0, 0.3), (20, 0.35)], "answers": 20, "ask_rate": 1.0}]}
    longer = {"iterations": 4, "runs": [{"strategy": "d3po", "seed": 0, "answers": 80, "ask_rate": 1.0,
                                         "curve": [(0, 0.3), (20, 0.35), (40, 0.45), (60, 0.6), (80, 0.7)]}]}
    for name, d in (("a.json", first), ("b.json", longer)):
        (tmp_path / name).write_text(json.dumps(d))
    out = ba.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "m.json")])
    assert [r["strategy"] for r in out["runs"]] == ["oracle", "every", "d3po"]
    assert out["iterations_by_strategy"] == {"oracle": [2], "every": [2], "d3po": [4]}
    ratio = out["report"]["ratios"]["every/d3po"]
    assert ratio["values"] == [pytest.approx(20 / 60)] and ratio["bounded"] == 0        # 0.28 of gain first at 60
    assert json.load(open(tmp_path / "m.json"))["report"] == json.loads(json.dumps(out["report"]))


# ---------------------------------------------------------------------------------------------- budgets in work
import bench_budget as bb  # noqa: E402


def _curve(method, seed, pts, s_per_it):
    """A run's record: (train_time, reward) points, one iteration every ``s_per_it`` seconds."""
    return {"method": method, "seed": seed,
            "evals": [{"train_time": t, "iteration": round(t / s_per_it), "total_nfe": t, "eval_reward": r}
                      for t, r in pts]}


def test_a_budget_is_the_baselines_first_n_iterations_and_the_time_they_took():
    base = _curve("traj_window", 0, [(2.0 * i, 0.5 + 0.01 * i) for i in range(11)], 2.0)["evals"]
    assert bb.budget_time(base, 4) == 8.0 and math.isnan(bb.budget_time(base, 11))
    assert [e["iteration"] for e in bb.cut(base, "iteration", 4)] == [0, 1, 2, 3, 4]
    assert [e["train_time"] for e in bb.cut(base, "train_time", 5.0)] == [0.0, 2.0, 4.0]


def test_first_passage_on_both_sides_credits_a_plateau_with_its_early_time():
    """A baseline that reaches 0.6 at 10 s and stays there to 40 s: the denominator is 10 s, not 40 s (the old
    reading's whole-run time would give a ratio 4x smaller). Raw curves (smooth 1): closed forms."""
    base = [{"train_time": t, "iteration": t, "eval_reward": r} for t, r in [(0, 0.5), (10, 0.6), (20, 0.6), (40, 0.6)]]
    run = [{"train_time": t, "iteration": t / 2, "eval_reward": r} for t, r in [(0, 0.5), (4, 0.55), (8, 0.65)]]
    assert bb.first_passage_ratio(run, base, 1) == pytest.approx(6 / 10)           # 0.6 at 6 s, by interpolation
    assert bb.first_passage_ratio(run, base, 1, "iteration") == pytest.approx(3 / 10)
    never = [{"train_time": t, "iteration": t, "eval_reward": 0.55} for t in (0, 10, 20)]
    assert math.isnan(bb.first_passage_ratio(never, base, 1))
    flat = [{"train_time": t, "iteration": t, "eval_reward": 0.5} for t in (0, 10, 20)]
    assert math.isnan(bb.first_passage_ratio(run, flat, 1))                        # nothing to reach: no ratio


def test_tables_read_every_budget_from_one_run_and_nothing_past_it():
    """Per seed the baseline takes 2 s per iteration and rises 0.01 per iteration to 0.9, the tree twice as fast in
    time. At N = 10 (T_N = 20 s) the tree reaches the baseline's 0.6 (at 20 s, first passage 20 s) at 10 s:
    ratio 0.5. A second seed whose tree only gets there after T_N is not counted as reaching it at N = 10, but is at
    N = 40, where the baseline ends at 0.9 (80 s) and that tree gets there at 70 s."""
    recs = []
    for seed in (0, 1):
        recs.append(_curve("traj_window", seed, [(2.0 * i, 0.5 + 0.01 * i) for i in range(41)], 2.0))
    recs.append(_curve("tree", 0, [(1.0 * i, min(1.0, 0.5 + 0.01 * i)) for i in range(81)], 0.5))
    recs.append(_curve("tree", 1, [(1.0 * i, 0.5 if i <= 30 else min(0.95, 0.5 + 0.01 * (i - 30)))
                                   for i in range(81)], 0.5))
    res = bb.tables(recs, (10, 40), smooth=1)
    at10 = res["10"]["references"]["traj_window"]["tree"]["time"]
    assert at10["by_seed"][0] == pytest.approx(0.5) and math.isnan(at10["by_seed"][1])
    assert at10["reached"] == "1/2" and at10["met_goal"] == "0/2" and at10["goal"] == 0.33
    assert res["10"]["T_N_s"] == {0: 20.0, 1: 20.0}
    at40 = res["40"]["references"]["traj_window"]["tree"]["time"]["by_seed"]
    assert at40[0] == pytest.approx(40 / 80) and at40[1] == pytest.approx(70 / 80)
    # in iterations: the tree makes 4 iterations in the time of one of the baseline's and learns half as much in
    # each: 20 iterations to the baseline's 10
    assert res["10"]["references"]["traj_window"]["tree"]["iterations"]["by_seed"][0] == pytest.approx(2.0)
    # in samples: a record without leaves_per_iter samples the baseline's 192 per iteration, so the ratio is the same
    assert res["10"]["references"]["traj_window"]["tree"]["samples"]["by_seed"][0] == pytest.approx(2.0)
    # the same curve from a smaller batch (tree_p12: 96 leaves per iteration): still 20 iterations to the baseline's
    # 10, but 20 x 96 samples against 10 x 192, a ratio of 1 in samples
    half = dict(recs[2], method="tree_p12", leaves_per_iter=96)
    row = bb.tables(recs + [half], (10,), smooth=1)["10"]["references"]["traj_window"]["tree_p12"]
    assert row["iterations"]["by_seed"][0] == pytest.approx(2.0) and row["samples"]["by_seed"][0] == pytest.approx(1.0)
    assert row["time"]["goal"] == 0.33 and row["time"]["met_goal"] == "0/1"    # a tree variant: its 0.5 misses 0.33


def test_the_steady_clock_takes_out_the_load_a_young_run_carried():
    """The baseline: 2 s per iteration, +0.01 per iteration. The tree learns half as much per iteration (+0.005) at
    0.5 s each, but its first 4 iterations took 1.5 s (the machine was loaded). At N = 10 the target 0.6 takes the
    tree 20 iterations: 4 × 1.5 + 16 × 0.5 = 14 s on the wall clock (ratio 0.7) and 20 × 0.5 = 10 s on the steady
    clock (0.5 = 2 iterations per baseline iteration × a quarter of the cost), which the load does not move."""
    assert bb.steady_seconds_per_iteration(
        [{"train_time": t, "iteration": i} for t, i in [(0, 0), (2, 2), (5, 5), (10, 6)]]) == 1.0   # rates 1, 1, 5
    assert bb.steady_seconds_per_iteration(
        [{"train_time": t, "iteration": i} for t, i in [(0, 0), (1, 1), (4, 2)]]) == 2.0            # rates 1, 3
    assert math.isnan(bb.steady_seconds_per_iteration([{"train_time": 0.0, "iteration": 0}]))
    base = _curve("traj_window", 0, [(2.0 * i, 0.5 + 0.01 * i) for i in range(41)], 2.0)
    times = [0.0]
    for i in range(1, 161):
        times.append(times[-1] + (1.5 if i <= 4 else 0.5))
    tree = {"method": "tree", "seed": 0, "evals": [{"train_time": t, "iteration": i, "eval_reward": 0.5 + 0.005 * i}
                                                   for i, t in enumerate(times)]}
    row = bb.tables([base, tree], (10,), smooth=1)["10"]["references"]["traj_window"]["tree"]
    assert row["time"]["by_seed"][0] == pytest.approx(14 / 20)
    assert row["steady"]["by_seed"][0] == pytest.approx(10 / 20)
    assert row["steady"]["by_seed"][0] == pytest.approx(row["iterations"]["by_seed"][0] * 0.5 / 2.0)
    assert row["steady"]["goal"] == 0.33 and row["steady"]["met_goal"] == "0/1"
    # without the load the two clocks agree
    even = dict(tree, evals=[dict(e, train_time=0.5 * e["iteration"]) for e in tree["evals"]])
    row = bb.tables([base, even], (10,), smooth=1)["10"]["references"]["traj_window"]["tree"]
    assert row["time"]["by_seed"][0] == pytest.approx(row["steady"]["by_seed"][0]) == pytest.approx(0.5)


def test_pooling_refuses_a_seed_that_two_runs_hold():
    """Seeds 0-1 and 2-3 pool; a second file that also holds seed 1 would pair one run's tree with the other's
    baseline, so it is refused with the files and the seed named."""
    def part(seeds):
        return {"records": [_curve(m, s, [(0.0, 0.5), (2.0, 0.6)], 2.0) for s in seeds for m in ("traj_window", "tree")]}
    pooled = bb.pool_records([part([0, 1]), part([2, 3])], ["a.json", "b.json"])
    assert sorted({r["seed"] for r in pooled}) == [0, 1, 2, 3] and len(pooled) == 8
    with pytest.raises(SystemExit, match=r"c.json and a.json both hold traj_window seed 1.*--first-seed"):
        bb.pool_records([part([0, 1]), part([1, 2])], ["a.json", "c.json"])


def test_cost_split_gives_each_phase_in_the_baselines_iterations_paired_per_seed():
    """Seed 0: the baseline's iteration takes 2.0 s, the tree's 0.9 s (sample 0.5, update 0.36, decode 0.01,
    reward 0.03): 0.45 of it = 0.25 + 0.18 + 0.02. Seed 1: the baseline is slower (2.5 s) and the tree costs
    1.0 s: 0.40. Each seed is divided by its own baseline, so the mean is 0.425, not the pooled 1.9 / 4.5."""
    def rec(method, seed, sample, update, decode, reward):
        split = {"t_sample": sample, "t_update": update, "t_decode": decode, "t_reward": reward,
                 "t_iter": sample + update + decode + reward}
        return {"method": method, "seed": seed, "split": split}
    recs = [rec("traj_window", 0, 0.75, 1.2, 0.01, 0.04), rec("tree", 0, 0.5, 0.36, 0.01, 0.03),
            rec("traj_window", 1, 1.0, 1.45, 0.01, 0.04), rec("tree", 1, 0.6, 0.36, 0.01, 0.03)]
    cost = bb.cost_split(recs)
    assert list(cost) == ["traj_window", "tree"]
    assert cost["traj_window"]["t_iter"]["by_seed"] == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}
    tree = cost["tree"]
    assert tree["t_iter"]["by_seed"] == {0: pytest.approx(0.45), 1: pytest.approx(0.40)}
    assert tree["t_iter"]["mean"] == pytest.approx(0.425)
    assert tree["t_sample"]["by_seed"][0] == pytest.approx(0.25) and tree["t_update"]["by_seed"][0] == pytest.approx(0.18)
    assert tree["t_score"]["by_seed"][0] == pytest.approx(0.02) and tree["t_score"]["by_seed"][1] == pytest.approx(0.016)
    # a method whose seed has no baseline record is not divided by another seed's
    assert set(bb.cost_split(recs + [rec("tree", 2, 0.5, 0.3, 0.0, 0.0)])["tree"]["t_iter"]["by_seed"]) == {0, 1}


def test_the_ratio_at_equal_reward_pairs_first_passages_per_level_over_whole_runs():
    """Three seeds; the baseline takes 2 s per iteration and rises 0.01 per iteration from 0.5, seed 2's stops at
    0.7. The levels are 0.52, 0.54, ... up to the highest that 2 of 3 baseline seeds reach (0.9). The tree rises
    0.01 per second (seeds 0 and 2: ratio 0.5 at every level) or 0.02 (seed 1: 0.25). Above 0.7 seed 2's baseline
    never gets there: no ratio for that seed, and its passage counts as infinite in the baseline's median."""
    recs = []
    for seed in (0, 1, 2):
        top = 0.7 if seed == 2 else 0.9
        recs.append(_curve("traj_window", seed, [(2.0 * i, min(top, 0.5 + 0.01 * i)) for i in range(41)], 2.0))
        rate = 0.02 if seed == 1 else 0.01
        recs.append(_curve("tree", seed, [(1.0 * i, min(0.95, 0.5 + rate * i)) for i in range(81)], 0.5))
    lv = bb.level_table(recs, 40, smooth=1)
    assert lv["levels"] == pytest.approx([0.52 + 0.02 * i for i in range(20)])
    i06, i08 = lv["levels"].index(pytest.approx(0.6)), lv["levels"].index(pytest.approx(0.8))
    assert lv["baseline_iterations"][i06] == pytest.approx(10) and lv["baseline_iterations"][i08] == pytest.approx(30)
    tree = lv["methods"]["tree"]
    at06, at08 = tree["ratio"][i06], tree["ratio"][i08]
    assert at06["by_seed"] == {0: pytest.approx(0.5), 1: pytest.approx(0.25), 2: pytest.approx(0.5)}
    assert at06["met_goal"] == "1/3" and at06["reached"] == "3/3"
    assert at08["by_seed"][0] == pytest.approx(0.5) and math.isnan(at08["by_seed"][2]) and at08["reached"] == "2/3"
    # the tree's own passage in baseline iterations (time / 2 s): 5, 2.5, 5 at 0.6 -> median 5
    assert tree["iterations"][i06] == pytest.approx(5)
    # a baseline whose median run never rises 0.02: no level
    flat = [_curve("traj_window", s, [(2.0 * i, 0.5 + 0.001 * i) for i in range(11)], 2.0) for s in (0, 1)]
    assert bb.level_table(flat, 10, smooth=1)["levels"] == []
    assert bb._median([30.0, 30.0, math.nan]) == 30.0 and bb._median([1.0, math.nan]) == math.inf


def test_variants_are_their_method_with_only_their_changes():
    """Every registered variant is its method's configuration with only its named change: the batch (12 prompts),
    the window's position and branching, the tail and the lr schedule of the demo's default."""
    tree = h.METHODS["tree"]
    start0 = h.DEMO.overrides("tree_start0")
    assert start0["tree"] == {**tree["tree"], "window_start": 0} and start0["advantage"] == tree["advantage"]
    shaped = h.DEMO.overrides("tree_42_start0")["tree"]
    assert shaped == {**tree["tree"], "window_start": 0, "window_width": 2, "branch_schedule": [4, 2]}
    wide = h.DEMO.overrides("tree_44_start0")     # 16 leaves per prompt: half the prompts, the same 192 leaves
    assert wide["tree"]["branch_schedule"] == [4, 4] and wide["prompts_per_iter"] * 16 == h.LEAVES_PER_ITER
    assert h.DEMO.overrides("awm") == h.METHODS["awm"]
    assert h.DEMO.overrides("tree_p12") == {**tree, "prompts_per_iter": 12}
    assert h.DEMO.overrides("traj_window_p12") == {**h.METHODS["traj_window"], "prompts_per_iter": 12}
    assert h.DEMO.overrides("tree_44_start0_p6") == {**wide, "prompts_per_iter": 6}
    assert h.DEMO.overrides("tree_p12_lr4e-3") == h.merge(tree, {"prompts_per_iter": 12, "optim": {"lr": 4e-3}})
    default = h.DEMO.overrides("tree_tail1to2_lrhalf100_p12")
    assert default == h.merge(tree, {"prompts_per_iter": 12,
                                     "tree": {"tail_steps": 1, "tail_steps_schedule": [[0, 1], [60, 2]]},
                                     "optim": {"lr_factor_schedule": [[0, 1], [100, 0.5]]}})
    # the demo's own default trains the same tree, tail and schedule (treegrpo demo, the demo workflow)
    from treegrpo.config import TrainConfig

    from treegrpo.demo.config import demo_run_config_dict

    mine = TrainConfig.from_dict(h.DEMO.config_dict(default))
    shipped = TrainConfig.from_dict(demo_run_config_dict())
    assert (mine.prompts_per_iter, mine.tree.tail_steps, mine.tree.tail_steps_schedule, mine.optim.lr,
            mine.optim.lr_factor_schedule) == (shipped.prompts_per_iter, shipped.tree.tail_steps,
                                               shipped.tree.tail_steps_schedule, shipped.optim.lr,
                                               shipped.optim.lr_factor_schedule)


def test_the_schedule_runs_each_job_after_its_dependencies_in_the_listed_order():
    import threading
    order, lock = [], threading.Lock()

    def job(key):
        def fn():
            with lock:
                order.append(key)
            return key
        return fn

    jobs = [("b0", (), job("b0")), ("b1", (), job("b1")), ("t0", ("b0",), job("t0")), ("t1", ("b1",), job("t1"))]
    done = bb.schedule(jobs, 2)
    assert done == {k: k for k in ("b0", "b1", "t0", "t1")}
    assert order.index("t0") > order.index("b0") and order.index("t1") > order.index("b1")

    def boom():
        raise RuntimeError("run failed")
    with pytest.raises(RuntimeError, match="run failed"):
        bb.schedule([("a", (), boom), ("b", ("a",), job("b"))], 2)


def test_one_tiny_work_budget_comparison_end_to_end(tmp_path):
    """The baseline trains 3 iterations, evaluated after each; the tree trains for the time that took, evaluated as
    often; the table reads budgets 2 and 3 from those two runs; an unknown method is refused."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_budget.py"), "--seeds", "1",
                        "--budgets", "2,3", "--methods", "tree", "--jobs", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "budget.json"))
    by = {x["method"]: x for x in res["records"]}
    base, tree = by["traj_window"], by["tree"]
    assert base["iterations"] == 3 and [e["iteration"] for e in base["evals"]] == [0, 1, 2, 3]
    assert tree["train_time"] >= base["train_time"] and len(tree["evals"]) >= 3   # ran the baseline's training time
    assert tree["leaves_per_iter"] == base["leaves_per_iter"] == h.LEAVES_PER_ITER   # 24 prompts x 8 leaves
    assert set(res["budgets"]) == {"2", "3"} and res["budgets"]["3"]["T_N_s"]["0"] == pytest.approx(base["train_time"])
    assert "tree ÷ traj_window" in r.stdout and "at equal reward" in r.stdout
    assert set(res["levels"]) >= {"levels", "baseline_iterations", "methods"}
    assert set(res["provenance"]["configs"]) == {"base", "traj_window", "tree"} and res["provenance"]["commit"]
    assert res["cost"]["tree"]["t_iter"]["by_seed"]["0"] == pytest.approx(tree["split"]["t_iter"] / base["split"]["t_iter"])
    for methods, says in (("trees", "unknown configuration"), ("tree_p13", "unknown configuration"),
                          ("traj_window", "the baseline")):   # the baseline itself is no method beside it
        bad = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_budget.py"), "--methods", methods],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert bad.returncode != 0 and says in bad.stderr, bad.stderr


def test_gradient_noise_statistics_against_a_known_distribution():
    """bench_gradient.noise_stats on draws g = μ + σ·ε (P = 50 coordinates, ||μ||² = 2, σ² = 0.04 per coordinate):
    SNR = ||μ||² / (P σ²) = 1.0, estimated without bias (||ḡ||² alone would add P σ² / R); identical draws have no
    noise; the leave-one-out cosine of pure noise is about 0."""
    import torch

    import bench_gradient as bg

    g = torch.Generator().manual_seed(0)
    p, r = 50, 4000
    mu = torch.zeros(p, dtype=torch.float64)
    mu[:2] = 1.0
    draws = mu + 0.2 * torch.randn(r, p, generator=g, dtype=torch.float64)
    st = bg.noise_stats(draws)
    # the noise estimate has relative sd sqrt(2 / (R P)) = 0.3 %; the signal's about 2 % here
    assert st["noise"] == pytest.approx(p * 0.04, rel=0.02) and st["snr"] == pytest.approx(1.0, rel=0.06)
    few = bg.noise_stats(draws[:6])
    assert few["signal"] < float(draws[:6].mean(0).pow(2).sum())          # the mean's own noise is taken off
    pure = bg.noise_stats(0.2 * torch.randn(400, p, generator=g, dtype=torch.float64))
    assert abs(pure["cos_loo"]) < 0.05 and pure["snr"] < 0.05
    same = bg.noise_stats(mu.expand(5, p).clone())
    assert same["noise"] == 0 and math.isnan(same["snr"]) and same["cos_loo"] == pytest.approx(1.0)


def test_bench_gradient_measures_each_methods_gradient_at_the_base_model(tmp_path):
    """Three independent iterations per method at the base model, no optimiser step in between: the same policy for
    every draw, so the draws differ only by their samples; the flow-matching objectives and too few draws are
    refused."""
    import bench_gradient as bg

    out = bg.main(["--draws", "3", "--methods", "tree,traj_window", "--out", str(tmp_path / "g.json")])
    rows = out["methods"]
    assert set(rows) == {"tree", "traj_window"} and rows["traj_window"]["snr_vs_window"] == pytest.approx(1.0)
    for r in rows.values():
        assert -1 <= r["cos_loo"] <= 1 and r["noise"] > 0 and r["s_per_iter"] > 0
    # 24 prompts: a tree has 2 + 4 + 8 edges, a window-GRPO group 8 trajectories x 3 window steps
    assert rows["tree"]["edges"] <= 24 * 14 and rows["traj_window"]["edges"] <= 24 * 24
    assert json.load(open(tmp_path / "g.json"))["draws"] == 3
    with pytest.raises(SystemExit, match="at least 3"):
        bg.main(["--draws", "2"])
    with pytest.raises(SystemExit, match="GRPO gradient"):
        bg.main(["--draws", "3", "--methods", "awm", "--out", str(tmp_path / "a.json")])


def test_step_mix_finds_the_snr_maximising_step_weights_of_a_known_distribution():
    """Two window steps with orthogonal noise: step 0's share is μ0 + σ0 ε, step 1's μ0 + σ1 ε' (the same mean
    direction, P = 40 coordinates). Each alone has SNR ||μ0||² / (P σ_j²); a weighted sum a0 g0 + a1 g1 has
    SNR (a0 + a1)² ||μ0||² / (P (a0² σ0² + a1² σ1²)), largest at a_j ∝ 1 / σ_j² (inverse-variance weighting), where it
    is the sum of the two SNRs; "steps" (a = 1, 1) gives 4 ||μ0||² / (P (σ0² + σ1²))."""
    import torch

    import bench_gradient as bg

    g = torch.Generator().manual_seed(1)
    p, r, s0, s1 = 40, 6000, 0.1, 0.2
    mu = torch.zeros(p, dtype=torch.float64)
    mu[0] = 1.0
    shares = torch.stack([mu + s0 * torch.randn(r, p, generator=g, dtype=torch.float64),
                          mu + s1 * torch.randn(r, p, generator=g, dtype=torch.float64)], dim=1)
    mix = bg.step_mix(shares)
    snr0, snr1 = 1 / (p * s0 ** 2), 1 / (p * s1 ** 2)
    # relative sd of the estimates here: signal ~1 %, noise ~0.3 %
    assert mix["snr_each_step"] == pytest.approx([snr0, snr1], rel=0.03)
    assert mix["snr_steps"] == pytest.approx(4 / (p * (s0 ** 2 + s1 ** 2)), rel=0.03)
    assert mix["snr_best"] == pytest.approx(snr0 + snr1, rel=0.03)
    # a ∝ (1/σ0², 1/σ1²) = (4, 1) up to scale, returned summing to the number of steps: (1.6, 0.4)
    assert mix["best_weights"] == pytest.approx([1.6, 0.4], abs=0.05)
    assert abs(mix["noise_corr"][0][1]) < 0.05


def test_bench_gradient_splits_the_gradient_by_window_step(tmp_path):
    """--per-step: each window step's share of the gradient (the loss is linear in the edge weights, so the shares
    add up to the whole gradient to float32 rounding), for a tree with its own branching per step."""
    import bench_gradient as bg

    d = bg.gradient_draws(h.DEMO.overrides("tree_42_start0"), 3, per_step=True)
    assert d["per_step"].shape[:2] == (3, 2)
    scale = float(d["grads"].abs().max())
    assert float((d["per_step"].sum(1) - d["grads"]).abs().max()) <= 1e-4 * scale
    assert all(float(d["per_step"][:, j].abs().max()) > 0 for j in range(2))   # both steps carry a gradient
    out = bg.main(["--draws", "3", "--per-step", "--methods",
                   'tree_k8_w1_start0,wide={"tree":{"window_start":0,"branch_schedule":[2,2,2]}}',
                   "--out", str(tmp_path / "g.json")])
    assert set(out["methods"]) == {"tree_k8_w1_start0", "wide"}
    assert len(out["methods"]["wide"]["steps"]["best_weights"]) == 3
    assert sum(out["methods"]["wide"]["steps"]["best_weights"]) == pytest.approx(3.0)


def test_block_costs_are_fitted_exactly_and_evaluated_at_the_published_depth():
    """bench_iteration's extrapolation of a model too large for this machine: cost = fixed + Σ per-block cost ×
    blocks, solved from as many depths as unknowns, recovers the coefficients (float64 solve: to 1e-12)."""
    import bench_iteration as bi

    fixed, double, single = 0.3, 0.11, 0.05
    pts = [(b, fixed + double * b[0] + single * b[1]) for b in ([2, 4], [4, 4], [2, 8])]
    assert bi.fit_blocks(pts) == pytest.approx([fixed, double, single], rel=1e-12)


TINY_SD15 = {"use_checkpoint": False, "image_size": 8, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 32,
             "num_res_blocks": [1, 1], "transformer_depth": [1, 1], "channel_mult": [1, 2],
             "transformer_depth_middle": 1, "use_linear_in_transformer": False, "context_dim": 32,
             "transformer_depth_output": [1, 1, 1, 1], "use_temporal_attention": False, "use_temporal_resblock": False}
TINY_FLUX = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16, "vec_in_dim": 32,
             "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 1,
             "depth_single_blocks": 1, "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2, "qkv_bias": True}


def test_bench_iteration_times_each_method_through_the_comfyui_path(comfyui_pack, tmp_path, monkeypatch):
    """ComfyUI's own classes at tiny widths (the published ones are the benchmark's), the decode through ComfyUI's
    VAE: each method's iteration is composed from the per-row costs with the NFE and trained parents hand-counted
    here at the workflows' settings (T = 20 with CFG, Flux T = 16 without; window at step 1 of width 3, k = 2, 8
    leaves, 2 prompts); SD1.5's iterations, run whole through the Trainer, count the same; Flux's published-depth
    costs come from the block fit."""
    import bench_iteration as bi

    monkeypatch.setattr(bi, "architectures", lambda: {"sd15": ("SD15", TINY_SD15, (8, 32), None, "sd"),
                                                      "flux_dev": ("Flux", TINY_FLUX, (8, 32), 32, "sd3")})
    monkeypatch.setattr(bi, "ITERATE", {"sd15": None})
    monkeypatch.setattr(bi, "FITS", {"flux_dev": {"blocks": ("depth", "depth_single_blocks"), "published": (3, 4),
                                                  "depths": ({"depth": 1, "depth_single_blocks": 1},
                                                             {"depth": 2, "depth_single_blocks": 1},
                                                             {"depth": 1, "depth_single_blocks": 2})}})
    monkeypatch.setattr(bi, "VAE_CH", 32)
    out = bi.main(["--models", "sd15,flux_dev", "--px", "32", "--no-hps", "--out", str(tmp_path / "it.json")])

    def hand(method, t, s=1, w=3, k=2):
        leaves, tail = k ** w, t - s - w
        return {"tree": s + sum(k ** j for j in range(w)) + leaves * tail,
                "window_grpo": s + 1 + leaves * (w - 1) + leaves * tail,
                "all_step_grpo": 1 + leaves * (t - 2) + leaves}[method]   # the window: every step but the last

    by = {r["model"]: r for r in out["models"]}
    for model, t, cfg_rows in (("sd15", 20, 2), ("flux_dev", 16, 1)):
        costs = by[model]["costs"]
        for m, r in by[model]["methods"].items():
            w = t - 1 if m == "all_step_grpo" else 3
            # the update's parents (one forward with backward each): the tree's window nodes, a trajectory group's
            # shared first window step and each trajectory's later ones
            assert (r["nfe"], r["parents"]) == (2 * cfg_rows * hand(m, t), 2 * (7 if m == "tree" else 1 + 8 * (w - 1)))
            f, fb = costs["forward"], costs["forward_backward"]
            assert r["t_sample"] == pytest.approx(t * f["per_call"] + r["nfe"] / cfg_rows * f["per_row"])
            assert r["t_update"] == pytest.approx(math.ceil(r["parents"] / 64) * fb["per_call"] + r["parents"] * fb["per_row"])
            assert r["t_decode"] == by[model]["decode_s"] > 0 and r["t_reward"] == 0.0
    for m, c in by["sd15"]["check"]["methods"].items():       # the whole iterations run: counts as composed
        run = c["measured"]
        assert (run["nfe"], run["calls"], run["parents"]) == \
            (c["composed"]["nfe"], c["composed"]["calls"], c["composed"]["parents"]), m
        assert run["nfe"] == run["nfe_closed_form"] and min(run["t_sample"], run["t_update"]) > 0
    fit = by["flux_dev"]["fit"]["forward"]["per_row"]
    assert by["flux_dev"]["costs"]["forward"]["per_row"] == pytest.approx(fit[0] + 3 * fit[1] + 4 * fit[2])
    s = out["summary"]["flux_dev"]
    it = s["iteration_s"]
    assert s["tree_over_window_grpo"] == pytest.approx(it["tree"] / it["window_grpo"])
    assert "composed ÷ measured" in bi.markdown(out)
    assert json.load(open(tmp_path / "it.json"))["px"] == 32
    with pytest.raises(SystemExit, match="--px"):
        bi.main(["--px", "40"])
    with pytest.raises(SystemExit, match="unknown"):
        bi.main(["--models", "sd14"])


def test_bench_rows_counts_each_methods_rows_in_closed_form(tmp_path):
    """Per-row costs: the sampling rows are the closed-form NFE (a 12-prompt tree with the one-step tail: prefix 1 +
    window 1 + 2 + 4 + 8 leaves x 1 tail step = 16 a prompt; window GRPO: 1 + 1 + 8 + 8 + 8 x 2 = 34 a prompt for 24
    prompts), the update rows at most the parents (7 a tree; 1 + 8 + 8 a group), and too few iterations refused."""
    import bench_rows as br

    res = br.main(["--methods", "tree_tail1_p12", "--repeats", "1", "--tree-iterations", "3",
                   "--baseline-iterations", "3", "--out", str(tmp_path / "rows.json")])
    tree, base = res["mean"]["tree_tail1_p12"], res["mean"]["traj_window"]
    assert tree["sample_rows"] == 12 * 16 and base["sample_rows"] == 24 * 34
    assert 0 < tree["update_rows"] <= 12 * 7 and 0 < base["update_rows"] <= 24 * 17
    for r in (tree, base):
        assert r["s_per_sample_row"] > 0 and r["s_per_update_row"] > 0
    assert json.load(open(tmp_path / "rows.json"))["baseline"] == "traj_window"
    with pytest.raises(SystemExit, match="more than 2 iterations"):
        br.main(["--tree-iterations", "2"])


def test_bench_core_counts_the_samplers_calls_and_pairs_its_time_with_the_bare_models(tmp_path):
    """benchmarks/bench_core.py without the demo, 2 rounds: every tree shape's NFE equals the formula, and the
    overhead is the median of the per-round ratios (sampler and bare model timed in turn)."""
    import statistics

    import bench_core

    out = bench_core.main(["--skip-demo", "--repeat", "2", "--out", str(tmp_path / "core.json")])
    assert json.load(open(tmp_path / "core.json")) == json.loads(json.dumps(out))
    assert [(r["T"], r["s"], r["w"], r["k"]) for r in out["sampler"]] == [(10, 1, 3, 2), (10, 2, 2, 3), (16, 2, 4, 2),
                                                                          (10, 0, 1, 8)]
    for r in out["sampler"]:
        assert r["nfe"] == r["nfe_formula"] and r["rounds"] == 2 and r["calls"] == r["T"], r
        q1, q3 = r["overhead_quartiles"]
        assert q1 <= r["overhead"] <= q3 and r["sampler_s"] > 0 and r["raw_forward_s"] > 0, r
    paired = bench_core.paired_times([lambda: None, lambda: sum(range(1000))], 4)
    assert [len(t) for t in paired] == [4, 4] and statistics.median(paired[1]) > 0


def test_bench_presets_composes_paper_as_bench_iteration_and_shorter_tails_cheaper(tmp_path):
    """benchmarks/bench_presets.py on the stored unit costs: the 'paper' preset (the full Euler tail) is the tree
    bench_iteration.py composed, so its ratios are that file's summary; shorter tails cost less, monotonically."""
    import json as _json

    import bench_presets

    out = bench_presets.main(["--out", str(tmp_path / "presets.json")])
    src = _json.load(open(os.path.join(bench_presets.HERE, "results", "iteration.json")))
    for model, row in out["models"].items():
        summary = src["summary"][model]
        assert row["presets"]["paper"]["over_window_grpo"] == pytest.approx(summary["tree_over_window_grpo"], rel=1e-9)
        assert row["presets"]["paper"]["over_all_step_grpo"] == pytest.approx(summary["tree_over_all_step_grpo"],
                                                                               rel=1e-9)
        r = [row["presets"][p]["over_window_grpo"] for p in ("fast", "balanced", "paper")]
        assert r == sorted(r) and r[0] < r[-1]


def test_the_published_qwen2vl_sizes_have_the_published_parameter_counts():
    """bench_rewards composes the Qwen2-VL rewards' cost at the published widths: the configs it builds them from
    must be those models'. Qwen2-VL-2B, summed by hand: text 151936·1536 (tied embeddings) + 28 layers of 46,797,824
    (q, k, v with biases, o, the SwiGLU MLP, two norms) + the final norm = 1,543,714,304; vision: the patch conv
    1,505,280 + 32 blocks of 19,677,440 + the merger 34,087,936 = 665,271,296; in all 2,208,985,600."""
    import bench_rewards

    assert bench_rewards.published_params("vlm_judge") == 2_208_985_600
    n7 = bench_rewards.published_params("hpsv3")
    assert 8.28e9 < n7 < 8.30e9, n7          # Qwen2-VL-7B (8.29 B) with its vocabulary as HPSv3 grows it, and the head


def test_bench_ocr_scores_every_picture_by_the_rewards_rule(tmp_path):
    """bench_ocr on one text: 16 pictures (4 faces × 4 sizes) read by the reward's reader, each scored as the reward
    scores it, text that fits told from text cut off by its drawn width, and the summary counts what the rows say."""
    pytest.importorskip("rapidocr")
    import bench_ocr
    from treegrpo.rewards.ocr import text_reward

    out = tmp_path / "ocr.json"
    assert bench_ocr.main(["--readers", "v6", "--texts", "OPEN", "SALE WEEKEND", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["readers"]["v6"]
    rows, s = res["rows"], res["summary"]
    assert len(rows) == 2 * 4 * 4 == s["pictures"]
    assert all(r["reward"] == text_reward(r["read"], r["text"]) for r in rows)
    assert {r["fits"] for r in rows if r["text"] == "OPEN"} == {True}
    assert not all(r["fits"] for r in rows if r["text"] == "SALE WEEKEND")      # 64 px in DejaVu runs off 512
    assert s["fits"] == sum(r["fits"] for r in rows) and s["exact"] == sum(r["reward"] == 1.0 for r in rows)
    assert s["fits_below_0.9"] == sum(r["reward"] < 0.9 for r in rows if r["fits"])
    assert set(s["seconds_per_picture"]) == {"256", "384", "512"}


def test_bench_soak_watches_a_run_queued_through_the_real_server(tmp_path):
    """benchmarks/bench_soak.py shortened: the demo workflow queued through a real ComfyUI server with a websocket
    open, the server's memory sampled while it trains, and the run's files and LoRAs counted at the end."""
    import bench_soak

    out = tmp_path / "soak.json"
    assert bench_soak.main(["--iterations", "4", "--eval-every", "2", "--save-every", "2", "--sample-s", "0.2",
                            "--workdir", str(tmp_path / "w"), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["status"] == "success" and r["logged_iterations"] == 4 and r["evaluations"] == 3   # at 0, 2, 4
    assert r["lora_folder"]["files"] == 4        # the LoRA at iterations 2 and 4, the best, the final one
    evals = sorted(p.name for p in (tmp_path / "w" / "server" / "output" / "treegrpo" / "soak" / "evals").iterdir())
    assert evals == ["eval_000000.png", "eval_000002.png", "eval_000004.png"]
    assert r["run_folder"]["files"] >= 8 and r["run_folder"]["bytes"] > 0
    assert r["samples"] > 0 and r["rss_mb"]["peak"] >= r["rss_mb"]["end"] > 100   # a booted ComfyUI: > 100 MB
    assert r["ws_messages"] > 0 and r["s_per_it_median"]["first_tenth"] > 0
    w = r["warnings"]     # a warning line at most for each of the 3 checks an evaluation fails
    assert 0 <= w["console_warning_lines"] <= 3 * w["evaluations_failing_a_check"] and w["console_passed_lines"] == 0
    assert bench_soak.slope_per_1000([(0, 1.0), (500, 2.0), (1000, 3.0)]) == pytest.approx(2.0)
