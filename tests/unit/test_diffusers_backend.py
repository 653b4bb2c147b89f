"""The diffusers backend on tiny random pipelines of every family, saved with ``save_pretrained`` and
loaded back through ``from_pretrained`` (offline): deterministic sampling equals diffusers' own pipeline,
x̂0 equals diffusers' scheduler formulas, one TreeGRPO iteration through the CLI trainer with the NFE
formula, LoRA exports that diffusers' ``load_lora_weights`` reads (same outputs as the trained policy)."""
import json
import os

import pytest
import torch

from diffusers_fixtures import FAMILIES, build_pipeline, save_pipeline
from treegrpo import cli
from treegrpo.backends.diffusers import DiffusersPolicy, ModelLoadError, detect_family
from treegrpo.config import ConfigError, PipelineConfig, TrainConfig, TreeConfig
from treegrpo.lora import read_lora_file
from treegrpo.tree import Denoiser, NFECounter, euler_solve, expected_nfe
from treegrpo.run import check_size, run_training

PROMPTS = ["a red circle", "a blue square"]
PC = PipelineConfig(height=16, width=16)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> folder of a saved tiny pipeline (built once per test module)."""
    root = tmp_path_factory.mktemp("pipes")
    return {f: save_pipeline(f, str(root / f), seed=FAMILIES.index(f)) for f in FAMILIES}


def _pipe_latents(pipe, family, noise, guidance, steps):
    """diffusers' own deterministic sampler (Euler in the model's sigma/flow schedule) -> final latents."""
    from diffusers import EulerDiscreteScheduler
    kw = dict(num_inference_steps=steps, output_type="latent", height=16, width=16, return_dict=False)
    if family in ("sd", "sd_v", "sdxl"):
        pipe.scheduler = sch = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        sch.set_timesteps(steps)  # the pipeline multiplies the latents by init_noise_sigma (√(σ0²+1) here);
        start = noise * sch.sigmas[0] / sch.init_noise_sigma  # start from x = σ0·noise, as k-diffusion does
        return pipe(PROMPTS, guidance_scale=guidance, negative_prompt=[""] * 2, latents=start, **kw)[0]
    if family == "sd3":
        return pipe(PROMPTS, guidance_scale=guidance, negative_prompt=[""] * 2, latents=noise, **kw)[0]
    packed = pipe._pack_latents(noise, *noise.shape)
    out = pipe(PROMPTS, guidance_scale=3.5, true_cfg_scale=guidance, negative_prompt=[""] * 2 if guidance > 1 else None,
               latents=packed, **kw)[0]
    return pipe._unpack_latents(out, 16, 16, pipe.vae_scale_factor)


@pytest.mark.parametrize("family", FAMILIES)
def test_ode_sampling_equals_the_diffusers_pipeline(saved, family):
    """Our Euler ODE in the policy's sigma space (CFG on x̂0, Flux packing, SDXL time ids, SD3 shift,
    Flux dynamic shift) reproduces the pipeline's own Euler sampling from the same noise."""
    guidance = 1.0 if family == "flux" else 2.0
    policy = DiffusersPolicy.load(saved[family], PC, guidance_hint=guidance)
    assert policy.family == family.replace("sd_v", "sd")
    steps = 4
    noise = torch.randn((2, *policy.latent_shape()), generator=torch.Generator().manual_seed(0))
    sig = policy.sigmas(steps)
    den = Denoiser(policy, policy.encode_prompts(PROMPTS), guidance, NFECounter())
    with torch.no_grad():
        ours = euler_solve(den, noise * sig[0], sig, torch.arange(2), prediction=policy.prediction)
        theirs = _pipe_latents(policy.pipe, family, noise, guidance, steps)
    assert theirs.shape == ours.shape
    err = (ours - theirs).abs().max() / theirs.abs().max()
    assert err < 2e-4, float(err)


@pytest.mark.parametrize("family", ["sd", "sd_v"])
def test_x0_matches_ddim_pred_original_sample(saved, family):
    """Epsilon and v-prediction: x̂0 in sigma space equals DDIMScheduler's ``pred_original_sample`` for the
    same model output at an integer timestep (x_ddpm = x/√(σ²+1))."""
    from diffusers import DDIMScheduler
    policy = DiffusersPolicy.load(saved[family], PC)
    sched = DDIMScheduler.from_config(policy.pipe.scheduler.config)
    sched.set_timesteps(10)
    t = int(sched.timesteps[3])
    ac = sched.alphas_cumprod[t]
    sigma = ((1 - ac) / ac).sqrt().reshape(1).float()
    assert abs(float(policy.sigma_to_t(sigma)) - t) < 1e-3
    x = torch.randn((1, *policy.latent_shape()), generator=torch.Generator().manual_seed(1)) * sigma
    cond = policy.encode_prompts(PROMPTS[:1])
    with torch.no_grad():
        x0 = policy.denoise(x, sigma, cond, 1.0)
        x_ddpm = x / (sigma ** 2 + 1).sqrt()
        out = policy.model(x_ddpm, t, encoder_hidden_states=cond["cond"]["embeds"], return_dict=False)[0]
        ref = sched.step(out, t, x_ddpm, eta=0.0).pred_original_sample
    assert torch.allclose(x0, ref, atol=1e-5, rtol=1e-4), float((x0 - ref).abs().max())


def _train_cfg(folder, out, family, **kw):
    d = {"backend": "diffusers", "model": folder, "prompts": PROMPTS, "cfg": 1.0 if family == "flux" else 2.0,
         "rewards": [{"name": "jpeg_compressibility", "weight": 1.0}],
         "pipeline": {"height": 16, "width": 16},
         "tree": {"steps": 4, "window_start": 1, "window_width": 2, "branch": 2},
         "lora": {"rank": 4, "alpha": 8.0}, "optim": {"lr": 2e-2, "clip_range": 0.2},
         "iterations": 1, "prompts_per_iter": 2, "eval_every": 0, "checkpoint_every": 0,
         "output_dir": str(out), "run_name": f"tiny_{family}", "device": "cpu", "advantage": {"flat_floor": 0.0}}
    d.update(kw)
    return TrainConfig.from_dict(d)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_iteration_nfe_and_lora_exports(saved, tmp_path, family):
    """One TreeGRPO iteration through the CLI trainer: denoiser rows = the NFE formula, the LoRA moved, and
    the diffusers export, loaded by ``pipe.load_lora_weights``, reproduces the trained policy's samples."""
    cfg = _train_cfg(saved[family], tmp_path, family)
    rows = []
    import treegrpo.backends as backends
    real = backends.load_policy

    def counting(c, device=None):
        pol, name = real(c, device)
        pol.model.register_forward_hook(lambda m, a, kw, out: rows.append(
            (kw.get("hidden_states") if "hidden_states" in kw else a[0]).shape[0]), with_kwargs=True)
        return pol, name
    backends.load_policy = counting
    try:
        trainer, summary = run_training(cfg, progress=False)
    finally:
        backends.load_policy = real
    h = trainer.history[0]
    per_tree = expected_nfe(cfg.tree, guidance=cfg.guidance_scale)
    assert h["nfe"] == 2 * per_tree
    # the rest were update forwards: the policy's and, for the KL term, the reference's (LoRA off)
    sample_rows = sum(rows) - (h["forwards"] + h["ref_forwards"]) * (2 if cfg.guidance_scale > 1 else 1)
    assert sample_rows == 2 * per_tree, (sum(rows), h)
    assert h["edges"] > 0 and h["grad_norm"] > 0

    comfy, meta = read_lora_file(summary["lora"])
    prefix = "lora_unet_" if family in ("sd", "sd_v", "sdxl") else "lora_transformer_"
    assert comfy and all(k.startswith(prefix) for k in comfy)
    assert meta["treegrpo.base_model"].startswith(f"diffusers:{family.replace('sd_v', 'sd')}:")
    ups = [v for k, v in comfy.items() if k.endswith(".lora_up.weight")]
    assert any(u.abs().max() > 0 for u in ups), "the update did not move the LoRA"
    modules = {n.replace(".", "_") for n, _ in trainer.policy.model.named_modules()}
    assert {k[len(prefix):].rsplit(".", 2)[0] if k.endswith(".weight") else k[len(prefix):].rsplit(".", 1)[0]
            for k in comfy} <= modules

    # the diffusers twin: pipe.load_lora_weights -> same samples as our policy with the trained LoRA
    policy = trainer.policy
    noise = torch.randn((2, *policy.latent_shape()), generator=torch.Generator().manual_seed(3))
    sig = policy.sigmas(4)
    with torch.no_grad():
        den = Denoiser(policy, policy.encode_prompts(PROMPTS), cfg.guidance_scale, NFECounter())
        ours = euler_solve(den, noise * sig[0], sig, torch.arange(2), prediction=policy.prediction)
        with policy.lora_disabled():
            base = euler_solve(den, noise * sig[0], sig, torch.arange(2), prediction=policy.prediction)
    assert (ours - base).abs().max() > 1e-6
    fresh = DiffusersPolicy.load(saved[family], PC, guidance_hint=cfg.guidance_scale)
    fresh.pipe.load_lora_weights(summary["lora_diffusers"])
    with torch.no_grad():
        den2 = Denoiser(fresh, fresh.encode_prompts(PROMPTS), cfg.guidance_scale, NFECounter())
        theirs = euler_solve(den2, noise * sig[0], sig, torch.arange(2), prediction=fresh.prediction)
    assert torch.allclose(theirs, ours, atol=1e-5, rtol=1e-4), float((theirs - ours).abs().max())


def test_detection_and_load_errors(saved, tmp_path):
    assert detect_family(saved["sdxl"]) == "sdxl" and detect_family(saved["flux"]) == "flux"
    with pytest.raises(ModelLoadError, match="does not exist"):
        DiffusersPolicy.load(str(tmp_path / "nope"))
    single = tmp_path / "unet.safetensors"
    single.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="pipeline.config"):
        DiffusersPolicy.load(str(single), PipelineConfig(family="sd"))
    with pytest.raises(ModelLoadError, match="model_index.json"):
        DiffusersPolicy.load(str(tmp_path))
    with pytest.raises(ConfigError, match=r"PipelineConfig\.height"):
        PipelineConfig(height=20)
    # a family set against the folder's model_index.json: said on the command line before the model loads
    cfg = _train_cfg(saved["sd"], tmp_path / "fam", "sd").to_dict()
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    import treegrpo.backends as backends
    real, backends.load_policy = backends.load_policy, None      # loading the model would fail this test
    try:
        assert cli.main(["train", "--config", str(tmp_path / "run.json"), "--pipeline.family", "sdxl"]) == 2
    finally:
        backends.load_policy = real
    assert not (tmp_path / "fam").exists()
    # an SDE window at the last step of an SD/SDXL (DDIM) model, where a step adds no noise: said before loading,
    # also for a sliding window that gets there only at its last position (it failed there, mid-run)
    from treegrpo.run import prepare
    for tree, where in (({"window_start": 2}, "window_start + window_width <= 3"),
                        ({"window_start": 1, "window_schedule": "sliding"}, "window_max_start <= 1")):
        bad = _train_cfg(saved["sdxl"], tmp_path / "win", "sdxl",
                         tree={"steps": 4, "window_width": 2, "branch": 2, **tree})
        with pytest.raises(ConfigError, match="reaches the last step") as e:
            prepare(bad)
        assert where in str(e.value)
    prepare(_train_cfg(saved["flux"], tmp_path / "win", "flux", tree={"steps": 4, "window_start": 2,
                                                                      "window_width": 2, "branch": 2}))
    prepare(_train_cfg(saved["sdxl"], tmp_path / "win", "sdxl",     # ODE sampling (NFT, AWM): its evaluation's window
                       tree={"method": "ode", "steps": 4, "window_start": 1, "window_width": 2, "group_size": 4},
                       optim={"lr": 2e-2, "loss": "nft"}))
    with pytest.raises(ConfigError, match="method 'ode' samples no SDE window to move"):      # none to slide
        _train_cfg(saved["sdxl"], tmp_path / "win", "sdxl", tree={"method": "ode", "steps": 4, "window_start": 1,
                                                                  "window_width": 2, "group_size": 4,
                                                                  "window_schedule": "sliding"},
                   optim={"lr": 2e-2, "loss": "nft"})
    with pytest.warns(UserWarning, match="pipeline.config .* is not read"):     # a folder has its own configs
        prepare(_train_cfg(saved["flux"], tmp_path / "win", "flux", pipeline={"height": 16, "width": 16,
                                                                              "config": saved["sd"]}))
    with pytest.raises(ConfigError, match=r"TrainConfig\.model"):
        TrainConfig(backend="diffusers", prompts=["x"])


def test_resume_gives_the_same_lora_bytes(saved, tmp_path):
    """SD1.x tiny model: 2 iterations straight vs 1 + checkpoint + resume -> identical LoRA tensors."""
    a = _train_cfg(saved["sd"], tmp_path / "a", "sd", iterations=2, checkpoint_every=1)
    run_training(a, progress=False)
    b1 = _train_cfg(saved["sd"], tmp_path / "b", "sd", iterations=1, checkpoint_every=1)
    run_training(b1, progress=False)
    b2 = _train_cfg(saved["sd"], tmp_path / "b", "sd", iterations=2, checkpoint_every=1)
    tr, _ = run_training(b2, resume=True, progress=False)
    assert tr.iteration == 2 and len(tr.history) == 2
    ta = read_lora_file(str(tmp_path / "a" / "tiny_sd.safetensors"))[0]
    tb = read_lora_file(str(tmp_path / "b" / "tiny_sd.safetensors"))[0]
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    for name in ("tiny_sd.safetensors", "tiny_sd_diffusers.safetensors"):   # both files: the same bytes
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    ck = torch.load(sorted((tmp_path / "b" / "checkpoints").glob("*.pt"))[-1], weights_only=True)
    assert {"lora", "optimizer", "train_time", "torch_rng", "python_rng", "numpy_rng", "iteration"} <= set(ck)


@pytest.mark.parametrize("family", ["sdxl", "flux"])
def test_gradient_checkpointing_gives_the_same_update(saved, tmp_path, family):
    """``memory.checkpointing`` on (diffusers' own checkpointing) recomputes activations: same LoRA after an update."""
    outs = []
    for gc in (False, True):
        cfg = _train_cfg(saved[family], tmp_path / str(gc), family, memory={"checkpointing": "on" if gc else "off"})
        tr, summary = run_training(cfg, progress=False)
        assert tr.policy.model.is_gradient_checkpointing == gc
        outs.append(read_lora_file(summary["lora"])[0])
    a, b = outs
    assert a.keys() == b.keys()
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_up" in k)
    assert all(torch.allclose(a[k], b[k], atol=1e-7, rtol=1e-5) for k in a)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_latent_shape_read_from_the_folders_configs_is_the_loaded_models(saved, tmp_path, family):
    """check_size reads a leaf's latent shape from the JSON configs before any weight loads: the same as the
    loaded policy's, at the default size and at a chosen one."""
    from treegrpo.backends import latent_shape_from_config

    for h, w in ((0, 0), (64, 128)):
        cfg = TrainConfig.from_dict({"backend": "diffusers", "model": saved[family], "prompts": ["a cat"],
                                     "pipeline": {**PC.__dict__, "height": h, "width": w}})
        policy = DiffusersPolicy.load(saved[family], cfg.pipeline)
        assert latent_shape_from_config(cfg) == tuple(policy.latent_shape()), (family, h, w)
    demo = TrainConfig.from_dict(cli.demo_config_dict())
    from treegrpo.backends import load_policy
    assert latent_shape_from_config(demo) == tuple(load_policy(demo)[0].latent_shape())


def test_a_run_starts_from_either_lora_file_a_diffusers_run_wrote(saved, tmp_path):
    """``lora.init_from``: the ComfyUI-key file and the diffusers one (``unet.`` keys) both put the trained LoRA
    into the new run's layers (the modules are matched by name, whatever the file's key style)."""
    from treegrpo.backends import load_policy
    from treegrpo.trainer import Trainer

    trained, summary = run_training(_train_cfg(saved["sd"], tmp_path / "a", "sd"), progress=False)
    want = trained.lora.weights()
    assert any(float(u.abs().max()) > 0 for u in want.up.values())
    from treegrpo.lora import from_state_dict
    for path in (summary["lora"], summary["lora_diffusers"]):    # alpha 8 ≠ rank 4: read from either file's own
        assert set(from_state_dict(*read_lora_file(path)).alpha.values()) == {8.0}, path   # metadata, not guessed
    for path in (summary["lora"], summary["lora_diffusers"]):
        cfg = _train_cfg(saved["sd"], tmp_path / "b", "sd", lora={"rank": 4, "alpha": 8.0, "init_from": path})
        policy, name = load_policy(cfg)
        got = Trainer(cfg, policy, {"jpeg_compressibility": lambda im, p: im.mean((1, 2, 3))}, progress=False,
                      base_model_name=name).lora.weights()
        assert sorted(got.down) == sorted(want.down), path
        for n in want.down:
            assert torch.allclose(got.down[n], want.down[n]) and torch.allclose(got.up[n], want.up[n]), (path, n)


@pytest.mark.parametrize("family", ["sd", "sdxl", "flux"])
def test_the_memory_plan_measures_every_family_with_a_reward_computed_on_the_host(saved, tmp_path, family):
    """With a memory budget (every GPU run) the plan's probe runs the denoiser, the VAE and the rewards on
    shape-only tensors: an epsilon model's σ → timestep lookup and a JPEG-size reward (numpy / PIL, host memory)
    once stopped every SD1.x / SDXL run and every jpeg run before its first iteration with a traceback."""
    cfg = _train_cfg(saved[family], tmp_path, family, memory={"budget_gb": 4.0, "reuse_probe": False})
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*prepares its images on the CPU")   # JPEG: nothing to say
        trainer, _ = run_training(cfg, progress=False)
    assert trainer.memory_plan is not None and trainer.iteration == 1


def test_export_turns_a_diffusers_runs_peft_file_into_its_comfyui_file_and_explains_the_other_way(saved, tmp_path,
                                                                                                   capsys):
    """A diffusers run writes its LoRA twice: ComfyUI's keys (``lora_unet_…``, which ComfyUI and diffusers both read)
    and PEFT keys (``unet.…``). ``treegrpo export --format comfy`` of the PEFT file gives the ComfyUI file's tensors
    under its keys (it gave ``diffusion_model.unet.…``, which neither loads); the ComfyUI file to PEFT is refused,
    saying why and which file to use (it gave ``lora_unet_….lora_A``, which nothing loads)."""
    _, summary = run_training(_train_cfg(saved["sd"], tmp_path / "run", "sd"), progress=False)
    out = tmp_path / "exported.safetensors"
    assert cli.main(["export", summary["lora_diffusers"], str(out), "--format", "comfy"]) == 0
    got, want = read_lora_file(str(out))[0], read_lora_file(summary["lora"])[0]
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert cli.main(["export", summary["lora"], str(out), "--format", "comfy", "--force"]) == 0   # ComfyUI's keys
    assert sorted(read_lora_file(str(out))[0]) == sorted(want)
    capsys.readouterr()
    assert cli.main(["export", summary["lora"], str(tmp_path / "peft.safetensors"), "--format", "peft"]) == 2
    err = capsys.readouterr().err
    assert "_diffusers.safetensors" in err and "load_lora_weights reads this file as it is" in err
