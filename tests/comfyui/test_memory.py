"""The memory model (treegrpo.memory): live-bytes measurement, the tree's counts, predicted vs measured peaks of
every phase on reduced configurations of each family (CLI demo, and ComfyUI's own classes), and the plan."""
import dataclasses

import pytest
import torch

from treegrpo import cli, memory
from treegrpo.backends import load_policy
from treegrpo.config import TrainConfig
from treegrpo.trainer import Trainer
from treegrpo.run import build_rewards

TOLERANCE = 0.15


def test_live_bytes_counts_storages_until_their_last_tensor_dies():
    with memory.LiveBytes() as lb:
        a = torch.zeros(1000)                # 4000 B
        v = a[10:20]                          # a view: no new storage
        b = torch.ones(250, dtype=torch.float64)   # 2000 B
        assert lb.now == 6000
        del a
        assert lb.now == 6000                 # the view keeps the storage
        del v, b
        assert lb.now == 0
    assert lb.peak == 6000


def test_fake_tensors_measure_what_real_ones_allocate():
    lin = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))

    def step(x):
        return torch.autograd.grad(lin(x).square().sum(), list(lin.parameters()))

    real = memory.peak_of(step, lambda: (torch.randn(32, 64),), fake=False)
    fake = memory.peak_of(step, lambda: (torch.randn(32, 64),), fake=True)
    assert real == fake > 0


def test_tree_counts_by_hand():
    """2 trees, k=2, w=3: levels of 2, 4, 8 parents, 16 leaves; stored = 2+4+8 window levels + 16 level-3 nodes +
    16 clean leaves; edges 4+8+16."""
    wl = memory.Workload(trees=2, branching=(2, 2, 2))
    assert (wl.leaves, wl.parents, wl.edges, wl.stored_latents) == (16, 14, 28, 46)
    c = memory.Curve(((1, 5), (2, 8), (8, 20)))
    assert (c(1), c(2), c(4), c(8), c(16)) == (5, 8, 12, 20, 36)
    assert memory.halvings(28) == [28, 14, 7, 3, 1]


def _measure(tr: Trainer) -> dict:
    """Bytes each phase allocates at its peak (above what exists when it starts), measured with real tensors on
    the second iteration (AdamW's state and the gradients exist by then, as in the model)."""
    tr.train_step()
    out = {}
    with memory.LiveBytes() as lb:
        batch = tr.sample()
    out["sample"] = lb.peak
    with memory.LiveBytes() as lb, torch.no_grad():
        images = tr.policy.decode(batch.leaves)
    out["decode"] = lb.peak
    with memory.LiveBytes() as lb:
        raw = tr.score_images(images, batch.leaf_prompts)
    out["reward"] = lb.peak
    tr.backup(batch, raw)
    with memory.LiveBytes() as lb:
        tr.update(batch)
    out["update"] = lb.peak
    return out


def _check(predicted: dict, measured: dict, phases) -> None:
    for k in phases:
        got, want = measured[k], predicted[k][1]
        assert want > 0 and abs(want - got) <= TOLERANCE * got, (k, got, want)


@pytest.mark.slow
@pytest.mark.parametrize("microbatch", [1, 5])
def test_cli_demo_every_phase_is_predicted(tmp_path, microbatch):
    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), eval_every=0, prompts_per_iter=3, optim=dict(microbatch=microbatch))
    cfg = TrainConfig.from_dict(d)
    rewards = build_rewards(cfg, "cpu")
    policy, _ = load_policy(cfg, torch.device("cpu"))
    tr = Trainer(cfg, policy, rewards, progress=False)
    wl = tr.workload()
    fp = memory.probe_policy(policy, cfg.prompts[0], cfg.guidance_scale, tr.params, rewards=list(rewards.values()),
                             kl=cfg.optim.kl_beta > 0, **memory.probe_rows(wl))
    _check(memory.phases(fp, wl), _measure(tr), memory.PHASES)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["demo", "sd15", "sdxl", "sd3", "flux", "chroma", "qwen_image", "hunyuan_video"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_comfy_families_sampling_and_update_are_predicted(comfyui_pack, tmp_path, arch, checkpointing):
    """ComfyUI's own model classes (tiny), through the Train node's policy: CFG 2.5, two trees of k=2, w=3,
    3 parents per microbatch. The probes run on fake tensors; the measurement on real ones."""
    from test_comfy_gradients import _policy
    policy, _ = _policy(arch, checkpointing)
    d = cli.demo_config_dict()
    d.update(backend="comfy", output_dir=str(tmp_path), eval_every=0, prompts=["p"], prompts_per_iter=1,
             trees_per_prompt=2, guidance_scale=2.5, optim=dict(microbatch=3),
             tree=dict(steps=6, window_start=1, window_width=3, branch=2))
    cfg = TrainConfig.from_dict(d)
    rewards = {"demo_adherence": lambda images, prompts: images.mean((1, 2, 3))}
    policy.decode = lambda latents: torch.sigmoid(latents[:, :3].float().flatten(2, -2))   # the tiny models: no VAE
    with torch.inference_mode(False):
        tr = Trainer(cfg, policy, rewards, progress=False)
        wl = dataclasses.replace(tr.workload(), checkpointing=checkpointing)
        fp = memory.probe_policy(policy, "p", cfg.guidance_scale, tr.params, kl=cfg.optim.kl_beta > 0, **memory.probe_rows(wl))
        assert fp.update_ckpt is not None and fp.update_ckpt(3) < fp.update(3)
        _check(memory.phases(fp, wl), _measure(tr), ("sample", "update"))


def _footprint(**kw) -> memory.Footprint:
    base = dict(weights={"denoiser": 4e9, "vae": 2e8, "rewards": 1e9}, lora=5e7, latent=4 * 16 * 128 * 128,
                image=3 * 1024 * 1024 * 4, sample=memory.Curve.linear(1e8, 1e8),
                update=memory.Curve.linear(2e8, 3e9), update_ckpt=memory.Curve.linear(2e8, 4e8),
                decode=memory.Curve.linear(0, 2e9), reward=memory.Curve.linear(0, 1e7))
    base.update(kw)
    return memory.Footprint(**base)


def test_the_plan_keeps_the_fastest_settings_that_fit():
    fp, wl = _footprint(), memory.Workload(trees=4, branching=(2, 2, 2), microbatch=64, decode_batch=1)
    roomy = memory.plan(fp, wl, 200e9)
    assert not roomy.workload.checkpointing and roomy.workload.microbatch == 28 and roomy.workload.sample_batch == 0
    def least(**fixed):
        return min(max(memory.predict(fp, c).values()) for c in memory.candidates(wl, fp, **fixed))

    # below the smallest peak without offload, the reward models go to the CPU; below the smallest with offload
    # alone, checkpointing comes on too
    plain, offloaded = least(checkpointing=False, offload_rewards=False), least(checkpointing=False, offload_rewards=True)
    tight = memory.plan(fp, wl, 0.99 * plain)
    assert tight.peak <= 0.99 * plain and tight.workload.offload_rewards and not tight.workload.checkpointing
    tighter = memory.plan(fp, wl, 0.99 * offloaded)
    assert tighter.workload.offload_rewards and tighter.workload.checkpointing
    # every choice can be fixed by the user
    fixed = memory.plan(fp, wl, 12e9, checkpointing=True, offload_rewards=False)
    assert fixed.workload.checkpointing and not fixed.workload.offload_rewards
    assert "checkpointing on" in fixed.line() and "planned peak" in fixed.line()


def test_a_footprint_written_as_json_plans_the_same_elsewhere():
    """benchmarks/gpu_memory.py plans on a GPU from footprints probed on a CPU: the round trip through JSON loses
    nothing, and the plan (settings and every phase's peak) is the same."""
    import json

    fp = _footprint(update_ckpt=None, decode_tiled=memory.Curve(((1, 5e8), (4, 9e8))), denoiser_params=123)
    back = memory.Footprint.from_dict(json.loads(json.dumps(fp.to_dict())))
    assert back == fp
    wl = memory.Workload(trees=2, branching=(2, 2, 2), microbatch=64, decode_batch=1)
    a, b = memory.plan(fp, wl, 20e9), memory.plan(back, wl, 20e9)
    assert a == b and a.peaks == b.peaks and b.footprint is back


def test_nothing_fits_names_the_smallest_change():
    fp, wl = _footprint(), memory.Workload(trees=8, branching=(2, 2, 2), microbatch=64, decode_batch=1)
    with pytest.raises(memory.MemoryPlanError, match="short"):
        memory.plan(fp, wl, 5.0e9)
    hint = memory.smallest_change(fp, wl, 6.5e9)
    assert "tree" in hint or "fp8" in hint or "resolution" in hint
    assert "a GPU with more memory" in memory.smallest_change(fp, wl, 1e9)
    # 2e9 parameters in 4e9 bytes (bf16): fp8 is advised when it is what fits; never for weights already in fp8
    one = dataclasses.replace(wl, trees=1, branching=(2,))
    bf16 = dataclasses.replace(fp, denoiser_params=int(2e9))
    need = min(max(memory.predict(bf16, c).values()) for c in memory.candidates(one, bf16))
    assert "fp8" in memory.smallest_change(bf16, one, need - 1.5e9)
    fp8 = dataclasses.replace(bf16, weights={**fp.weights, "denoiser": 2e9})
    assert "fp8" not in memory.smallest_change(fp8, one, need - 3.5e9)


@pytest.mark.slow
def test_a_small_budget_turns_checkpointing_on_and_a_tiny_one_stops_before_sampling(tmp_path, monkeypatch):
    """The CLI path: ``memory.budget_gb`` stands for the free memory of a GPU. Between the peak without
    checkpointing (even at 1 parent per microbatch) and the peak with it, the plan turns checkpointing on; the
    iteration then runs and its measured update stays within the budget."""
    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), eval_every=0, prompts_per_iter=1, iterations=1)
    cfg = TrainConfig.from_dict(d)
    policy, _ = load_policy(cfg, torch.device("cpu"))
    rewards = build_rewards(cfg, "cpu")
    tr = Trainer(cfg, policy, rewards, progress=False)
    wl = tr.workload()
    fp = memory.probe_policy(policy, cfg.prompts[0], cfg.guidance_scale, tr.params, rewards=list(rewards.values()),
                             kl=cfg.optim.kl_beta > 0, **memory.probe_rows(wl))
    assert fp.update_ckpt is not None and fp.update_ckpt(8) < fp.update(8) / 2

    def least(ckpt):
        return min(max(memory.predict(fp, c).values()) for c in memory.candidates(wl, fp, checkpointing=ckpt))

    off, on = least(False), least(True)
    assert on < off
    budget = (on + off) / 2
    lines = []
    tr.log = lines.append
    p = tr.plan_memory(budget)
    assert p.workload.checkpointing and p.peak <= budget
    assert lines[0].startswith("TreeGRPO memory: measuring the models at this size")   # the wait is announced
    assert lines[1:] == ["TreeGRPO memory: " + p.line()] and "checkpointing on" in lines[1]
    start = memory.phases(fp, p.workload)["update"][0]
    got = _measure(tr)["update"]
    assert start + got <= budget * (1 + TOLERANCE)

    d.update(memory=dict(budget_gb=on / 4 / 1e9))
    cfg2 = TrainConfig.from_dict(d)
    tr2 = Trainer(cfg2, load_policy(cfg2, torch.device("cpu"))[0], rewards, progress=False)
    monkeypatch.setattr(tr2, "sample", lambda: pytest.fail("sampled although nothing fits"))
    with pytest.raises(memory.MemoryPlanError, match="not enough accelerator memory"):
        tr2.train()
    assert tr2.iteration == 0 and not (tmp_path / "treegrpo_demo").exists()


@pytest.mark.slow
def test_the_train_node_plans_before_any_work(comfyui_pack, caplog):
    """The Train node's ``memory_budget_gb`` (what the GPU would report): a budget that fits logs the plan in one
    line and trains with checkpointing turned on; one that cannot fit stops before sampling (no run folder, no
    LoRA) with the message naming the shortfall and the change to make."""
    import logging
    from pathlib import Path

    import behaviour_fixture as bf
    import comfy_harness as ch

    run = "memory_plan_node"
    g = bf.train_node_graph(run, 1)
    g["train"]["inputs"].update(memory_budget_gb=0.00001, gradient_checkpointing="auto")
    # the refusal names the setting that made the plan, in units that show the sizes (10 kB, not 0.00 GB)
    with pytest.raises(ch.ComfyExecutionError, match=r"not enough accelerator memory.*memory_budget_gb\) is 10 kB "
                                                     r"\(.* short\): raise it"):
        comfyui_pack.execute(g)
    assert not (Path(comfyui_pack.base_dir) / "output" / "treegrpo" / run).exists()

    g["train"]["inputs"].update(memory_budget_gb=1.0, gradient_checkpointing="on")
    with caplog.at_level(logging.INFO):
        r = comfyui_pack.execute(g)
    lines = [m for m in caplog.messages if m.startswith("TreeGRPO memory: planned peak")]
    assert len(lines) == 1 and "checkpointing on" in lines[0] and "of 1.0 GB" in lines[0]
    assert "saved" in r.outputs["save"]["text"][0]
    # the refused queue measured the models; this one planned with that measurement (treegrpo/memory_cache.py)
    assert any("with the measurement of an earlier run of these models" in m for m in caplog.messages)
    assert not any(m.startswith("TreeGRPO memory: measuring") for m in caplog.messages)


def test_smaller_decode_and_reward_batches_come_before_anything_slower():
    """A heavy VAE decode (diffusers decodes ``pipeline.decode_batch`` latents at once): the plan lowers the decode
    batch and keeps checkpointing off and the whole microbatch; rewards without a batch size (0) stay as they are."""
    fp = _footprint(decode=memory.Curve.linear(0, 3e9), update_ckpt=None)
    wl = memory.Workload(trees=2, branching=(2, 2, 2), microbatch=2, decode_batch=8, reward_batch=32)
    full = max(memory.predict(fp, wl).values())
    p = memory.plan(fp, wl, full - 10e9)
    assert p.workload.decode_batch < 8 and p.workload.microbatch == 2 and p.workload.sample_batch == 0
    assert f"{p.workload.decode_batch} latents per decode" in p.line()
    assert memory.probe_rows(wl)["decode_rows"] == [8, 4, 2, 1]
    assert memory.candidates(dataclasses.replace(wl, reward_batch=0), fp)[0].reward_batch == 0


def test_a_tiled_decode_is_chosen_when_the_decode_does_not_fit():
    fp = _footprint(decode=memory.Curve.linear(0, 20e9), decode_tiled=memory.Curve.linear(0, 1e9), update_ckpt=None)
    wl = memory.Workload(trees=2, branching=(2, 2, 2), microbatch=2, decode_batch=1)
    p = memory.plan(fp, wl, max(memory.predict(fp, wl).values()) - 5e9)
    assert p.workload.tiled_decode and p.workload.microbatch == 2 and "tiled VAE decode" in p.line()


@pytest.mark.slow
def test_the_diffusers_vae_decodes_in_tiles_in_less_memory(tmp_path):
    """diffusers' own tiling (``AutoencoderKL.enable_tiling``) measured by the probe: a 256 px decode with 32 px
    tiles allocates a fraction of the whole decode; the policy switches it on and off."""
    import torch
    from diffusers import AutoencoderKL

    from treegrpo.backends.diffusers import DiffusersPolicy

    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, sample_size=32,
                        norm_num_groups=4)

    class Pol:   # only what probe_decode and set_tiled_decode use of a DiffusersPolicy
        pipe = type("P", (), {"vae": vae})()
        pcfg = type("C", (), {"decode_batch": 1})()
        device = torch.device("cpu")
        decode = DiffusersPolicy.decode
        probe_decode = DiffusersPolicy.probe_decode
        set_tiled_decode = DiffusersPolicy.set_tiled_decode

    pol = Pol()
    z = lambda: (torch.randn(1, 4, 128, 128),)   # noqa: E731  (1024 px)
    whole = memory.peak_of(pol.probe_decode, z)
    assert pol.set_tiled_decode(True) and vae.use_tiling
    tiled = memory.peak_of(pol.probe_decode, z)
    pol.set_tiled_decode(False)
    assert not vae.use_tiling and 0 < tiled < whole / 2, (tiled, whole)


def test_the_step_nodes_plan_once_per_run_and_keep_the_plan(comfyui_pack, monkeypatch, caplog):
    """The Tree Sampler makes the run's plan before its first tree (here with a simulated 1 GB device) and
    re-applies it to the policy of every later tree: one log line, checkpointing as the Trainer State asks."""
    import logging

    from treegrpo.comfyui import runtime, steps
    from treegrpo.comfyui.demo import load_demo_comfy
    from treegrpo.config import LoraConfig, OptimConfig, TreeConfig

    monkeypatch.setattr(runtime, "memory_budget", lambda device: 1e9)
    patcher, clip, _ = load_demo_comfy()
    enc = lambda t: clip.encode_from_tokens_scheduled(clip.tokenize(t))  # noqa: E731
    run = steps.RunState.get("plan_steps", LoraConfig(rank=2, alpha=2.0, targets=["to_q"]), OptimConfig(lr=1e-3),
                             gradient_checkpointing="on")
    latent = {"samples": torch.zeros(1, 3, 16, 16)}
    tcfg = TreeConfig(steps=6, window_start=1, window_width=2, branch=2)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            t = steps.sample_tree(patcher, enc("a red circle"), enc(""), latent, tcfg, seed=0, cfg=1.0,
                                  scheduler="simple", trees=1, prompt="a red circle", run=run)
            assert t.trainer.policy.gradient_checkpointing
    lines = [m for m in caplog.messages if m.startswith("TreeGRPO memory: planned peak")]
    assert len(lines) == 1 and "of 1.0 GB" in lines[0] and "checkpointing on" in lines[0]


def test_the_probe_can_be_stopped_between_its_measurements(tmp_path):
    """The memory probe (minutes of CPU on a large model) calls ``check`` before each measurement: a stop request
    ends it there, before any training, and the run can plan again afterwards. In the CLI the check is the run's
    stop request (Ctrl-C)."""
    from treegrpo.trainer import TrainingInterrupted

    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), eval_every=0, prompts_per_iter=1, iterations=1, memory=dict(budget_gb=4.0))
    cfg = TrainConfig.from_dict(d)
    rewards = build_rewards(cfg, "cpu")
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    tr = Trainer(cfg, load_policy(cfg, torch.device("cpu"))[0], rewards, progress=False)
    tr.log = lambda line: None
    with pytest.raises(KeyboardInterrupt):
        tr.plan_memory(check=check)
    assert len(calls) == 3 and tr.memory_plan is None and not tr.memory_planned
    done = []
    p = tr.plan_memory(check=lambda: done.append(1))      # every measurement is preceded by one check
    assert p is not None and tr.memory_planned and len(done) >= 8

    # the probe just made is kept (treegrpo/memory_cache.py): measuring again is what a stop must end here
    measure = TrainConfig.from_dict({**d, "memory": dict(budget_gb=4.0, reuse_probe=False)})
    stopped = Trainer(measure, load_policy(measure, torch.device("cpu"))[0], rewards, progress=False,
                      stop=lambda: True)
    stopped.log = lambda line: None
    with pytest.raises(TrainingInterrupted):
        stopped.train()
    assert stopped.iteration == 0 and stopped.memory_plan is None and not (tmp_path / "treegrpo_demo").exists()
    # with the kept measurement there is no probe to stop; the stop still comes before any training
    kept = Trainer(cfg, load_policy(cfg, torch.device("cpu"))[0], rewards, progress=False, stop=lambda: True)
    kept.log = lambda line: None
    with pytest.raises(TrainingInterrupted):
        kept.train()
    assert kept.iteration == 0 and kept.memory_plan is not None and not (tmp_path / "treegrpo_demo").exists()


@pytest.mark.slow
def test_cancel_stops_the_train_nodes_memory_probe(comfyui_pack, monkeypatch):
    """The Train node's Cancel during the memory probe: ComfyUI's interrupt ends the probe at its next measurement
    (the prompt is reported interrupted, no run folder is made), not minutes later when training starts."""
    from pathlib import Path

    import behaviour_fixture as bf
    import comfy_harness as ch

    real = memory.probe_policy
    seen = []

    def probe(*a, check=None, **kw):
        def cancel_then_check():
            seen.append(1)
            if len(seen) == 2:
                comfyui_pack.interrupt()      # what the web UI's Cancel does
            check()
        return real(*a, check=cancel_then_check, **kw)

    monkeypatch.setattr(memory, "probe_policy", probe)
    run = "memory_probe_cancel"
    g = bf.train_node_graph(run, 1)
    g["train"]["inputs"].update(memory_budget_gb=1.0)
    with pytest.raises(ch.ComfyInterrupted):
        comfyui_pack.execute(g)
    assert len(seen) == 2
    assert not (Path(comfyui_pack.base_dir) / "output" / "treegrpo" / run).exists()
