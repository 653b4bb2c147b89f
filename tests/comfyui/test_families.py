"""Every model family of ComfyUI 0.3.75's registry (``comfy.supported_models.models``): the table that says which
TreeGRPO trains (treegrpo/comfyui/families.py, the README's copy), and for each training family a tiny random
instance of ComfyUI's own class trained through the nodes' code path: a tree sampled and one update (the LoRA
changes), the LoRA gradient against finite differences, the saved LoRA loaded by ``LoraLoaderModelOnly`` with no
"lora key not loaded" and a changed output. Refused families: the Tree Sampler's and the Train node's error."""
import logging
import os
import types
from pathlib import Path

import pytest
import torch

from lora_gradcheck import lora_gradient_and_difference

from treegrpo.comfyui import families as F

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_registry_class_has_a_row_and_the_table_has_no_other(comfyui_pack):
    import comfy.supported_models as sm

    import comfy_harness as ch

    names = [k.__name__ for k in sm.models]
    assert len(names) == len(set(names)) >= 60
    newer = set(names) - set(F.FAMILIES)        # classes a ComfyUI newer than the table's added
    assert set(F.FAMILIES) <= set(names) and (not newer or ch.comfyui_version() != ch.FLOOR_VERSION), newer
    rows = F.family_rows()
    assert [r["class"] for r in rows] == names
    assert {r["class"] for r in rows if r["status"] == "untested"} == newer
    trains = {r["class"] for r in rows if r["status"] == "trains"}
    must = {"SD15", "SD20", "SDXL", "SSD1B", "SD3", "Flux", "FluxSchnell", "Flux2", "Chroma", "HiDream", "QwenImage",
            "ZImage", "Lumina2", "WAN21_T2V", "WAN22_T2V", "HunyuanVideo15", "AuraFlow", "PixArtAlpha", "PixArtSigma"}
    assert must <= trains, must - trains
    # a class ComfyUI adds later is listed as untested, not silently trained or refused
    new = type("NewFamily2027", (), {})
    assert F.family_rows([*sm.models, new])[-1]["status"] == "untested"


def test_readme_and_docs_family_tables_are_the_generated_ones(comfyui_pack):
    """The tables are generated from the classes of the table's own registry (0.3.75's, in its order; a newer
    ComfyUI keeps them in that order and adds its own, which the first test sees listed as untested)."""
    import comfy.supported_models as sm

    known = [k for k in sm.models if k.__name__ in F.FAMILIES]
    assert F.markdown_summary(known) in README.read_text(encoding="utf-8"), \
        "README's family list is stale: paste `python -m treegrpo.comfyui.families` (in ComfyUI's python)"
    assert F.markdown_table(known) in (README.parent / "docs" / "families.md").read_text(encoding="utf-8"), \
        "docs/families.md is stale: paste `python -m treegrpo.comfyui.families --table`"


def test_the_table_command_runs_in_comfyuis_python_without_a_gpu(comfyui_dir):
    """``python -m treegrpo.comfyui.families`` (the README's way to regenerate the family list) on a machine
    without a GPU: ComfyUI's --cpu is set for it (it stopped with "Found no NVIDIA driver")."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(comfyui_dir), str(README.parent)]))
    r = subprocess.run([sys.executable, "-m", "treegrpo.comfyui.families"], cwd=str(comfyui_dir), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "**Trains, text-to-image" in r.stdout


def _fake_model(class_name):
    """Something with ``model.model_config`` of a registry class (refusal happens before any model use)."""
    import comfy.supported_models as sm

    klass = getattr(sm, class_name)
    return types.SimpleNamespace(model=types.SimpleNamespace(model_config=klass.__new__(klass)))


REFUSED = sorted(k for k, f in F.FAMILIES.items() if not f.trains)


@pytest.mark.parametrize("name", REFUSED)
def test_refused_families_stop_at_the_tree_sampler_with_family_and_reason(comfyui_pack, name):
    TreeSampler = comfyui_pack.node_classes()["TreeGRPOTreeSampler"]
    fam = F.FAMILIES[name]
    with pytest.raises(F.FamilyError) as e:
        TreeSampler.execute(model=_fake_model(name), positive=None, negative=None, latent=None, seed=0, cfg=1.0,
                            scheduler="simple", steps=4, window_start=1, window_width=1, branch=2, noise_level=0.7,
                            window_schedule="fixed", trees_per_latent=1, prompt="")
    msg = str(e.value)
    assert fam.label in msg and name in msg and fam.reason in msg


def test_the_train_node_refuses_a_family_before_any_work(comfyui_pack):
    Train = comfyui_pack.node_classes()["TreeGRPOTrain"]
    with pytest.raises(F.FamilyError, match="Stable Video Diffusion.*input image"):
        Train.check_inputs(_fake_model("SVD_img2vid"), "a cat", "run", "auto")


def test_a_sampling_that_is_neither_flow_nor_sigma_space_is_refused_naming_the_family(comfyui_pack):
    """Lotus-style x0 prediction (``X0``/``IMG_TO_IMG``) put on an otherwise trainable model by a node: the error
    says a node in front did it, names the family and the sampling class (ComfyUI's model_sampling can be swapped by
    a node, so the family alone does not decide)."""
    import comfy.model_sampling as ms
    from comfy_test_pack import _tiny

    patcher, _, _ = _tiny("sd15", 0)

    class X0Sampling(ms.ModelSamplingDiscrete, ms.IMG_TO_IMG):
        pass

    patched = patcher.clone()
    patched.add_object_patch("model_sampling", X0Sampling(patcher.model.model_config))
    assert F.prediction_of(patcher) == "epsilon"
    with pytest.raises(F.FamilyError, match=r"a node in front of TreeGRPO .* made SD1\.x \(SD15\) predict x0 "
                                            r"\(IMG_TO_IMG\).*remove that node"):
        F.check_trainable(patched)


def test_lora_targets_widget():
    assert F.parse_targets("auto") == ["auto"]
    assert F.parse_targets("to_q, to_k  ff.net.2") == ["to_q", "to_k", "ff.net.2"]
    for bad, msg in (("", "empty"), ("auto, to_q", "mixes auto")):
        with pytest.raises(ValueError, match=msg):
            F.parse_targets(bad)
    tip = F.targets_tooltip()
    assert "Wan" in tip and "self_attn.q" in tip and "Qwen-Image" in tip


# ---------------------------------------------------------------- every training family, on a tiny instance
TRAINS = sorted(k for k, f in F.FAMILIES.items() if f.trains)


def _tiny_variants():
    from comfy_test_pack.families import VARIANTS
    return sorted(VARIANTS)


def _leaf_reward(leaves: torch.Tensor) -> torch.Tensor:
    """A deterministic reward of the leaf latents: their mean (distinct leaves get distinct rewards)."""
    return leaves.float().flatten(1).mean(1)


def _linear_names(patcher) -> set[str]:
    return {n for n, m in patcher.model.diffusion_model.named_modules() if isinstance(m, torch.nn.Linear)}


def _run_iteration(name: str, run_name: str, cfg: float):
    """One TreeGRPO iteration through what the step nodes call (Trainer State → Tree Sampler → Reward Scorer →
    Advantage Backup → Trainer Step), with the family's default LoRA targets (``auto``)."""
    from comfy_test_pack.families import build_trainable as build
    from treegrpo.comfyui.steps import RunState, backup_tree, sample_tree, train_step
    from treegrpo.config import AdvantageConfig, LoraConfig, OptimConfig, TreeConfig

    patcher, pos, neg, latent = build(name)
    run = RunState.get(run_name, LoraConfig(rank=2, alpha=2.0, targets=["auto"]),
                       OptimConfig(lr=5e-2, kl_beta=0.0, clip_range=1e-4), 0, "off")
    tree_cfg = TreeConfig(steps=4, window_start=1, window_width=1, branch=2, tail_solver="euler", tail_steps=0)
    with torch.inference_mode():   # as ComfyUI's executor runs nodes
        tree = sample_tree(patcher, pos, neg, {"samples": torch.zeros(1, *latent)}, tree_cfg, seed=0, cfg=cfg,
                           scheduler="simple", trees=1, prompt="x", run=run)
        before = {k: v.clone() for k, v in run.trainer.lora_tensors("comfy").items()}
        leaves = tree.batch.leaves
        tree = backup_tree(tree, {"rewards": {"r": _leaf_reward(leaves)}, "weights": {"r": 1.0}}, AdvantageConfig())
        stats = train_step(tree, run)
    return patcher, pos, neg, latent, run, before, stats


@pytest.mark.parametrize("name", TRAINS)
def test_family_samples_a_tree_and_updates_its_lora(comfyui_pack, name):
    """Its tiny instance is ComfyUI's class; every default LoRA target names Linear layers of it; a tree is sampled
    (leaves of the latent's shape, finite), one update changes the LoRA, and the saved file's keys are the model's
    Linear layers under ComfyUI's names."""
    from treegrpo.lora import read_lora_file

    fam = F.FAMILIES[name]
    cfg = 1.0 if fam.sampling == "flow" else 2.0
    patcher, _, _, latent, run, before, stats = _run_iteration(name, f"family_{name}", cfg)
    assert F.family_of(patcher) == (name, fam)
    assert F.sampling_kind(patcher) in fam.sampling.split(" / "), (F.sampling_kind(patcher), fam.sampling)
    linear = _linear_names(patcher)
    for t in fam.targets:
        assert any(n == t or n.endswith("." + t) for n in linear), f"{name}: LoRA target {t!r} matches no Linear"
    assert stats["edges"] > 0
    after = run.trainer.lora_tensors("comfy")
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{name}: the update left the LoRA as it was"
    saved, _ = read_lora_file(run.trainer.lora_path)
    mods = {k.rsplit(".lora_", 1)[0].rsplit(".alpha", 1)[0] for k in saved}
    assert mods and {m[len("diffusion_model."):] for m in mods} <= linear


@pytest.mark.parametrize("name", TRAINS)
def test_family_lora_loads_in_loraloadermodelonly_with_every_key(comfyui_pack, name):
    """The LoRA the update wrote, copied into models/loras: ComfyUI's own LoraLoaderModelOnly loads it with no
    "lora key not loaded", and the patched model's denoiser output differs from the base model's."""
    import shutil

    import folder_paths
    import nodes as comfy_nodes

    fam = F.FAMILIES[name]
    patcher, pos, _, latent, run, _, _ = _run_iteration(name, f"family_load_{name}", 1.0 if fam.sampling == "flow"
                                                        else 2.0)
    loras = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(os.path.join(loras, "families"), exist_ok=True)
    shutil.copy(run.trainer.lora_path, os.path.join(loras, "families", f"{name}.safetensors"))
    lines = []

    class Grab(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    h = Grab(logging.DEBUG)
    logging.getLogger().addHandler(h)
    try:
        (patched,) = comfy_nodes.LoraLoaderModelOnly().load_lora_model_only(patcher, f"families/{name}.safetensors",
                                                                            1.0)
    finally:
        logging.getLogger().removeHandler(h)
    assert not [ln for ln in lines if "lora key not loaded" in ln], lines

    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import LoraConfig

    def denoised(model):
        with torch.inference_mode(False):
            pol = ComfyPolicy(model, ["p"], [(pos, None)], latent, lora_cfg=LoraConfig(rank=1, alpha=1.0,
                                                                                       targets=["auto"]))
            g = torch.Generator().manual_seed(3)
            x = torch.randn((1, *latent), generator=g)
            sigma = pol.sigmas(4)[[1]]
            return pol.run(lambda: pol.denoise(x, sigma, pol.encode_prompts(["p"]), 1.0).detach().clone())

    base, lora = denoised(patcher), denoised(patched)
    assert torch.isfinite(lora).all()
    assert (base - lora).abs().max() > 1e-6, f"{name}: the loaded LoRA changed nothing"


@pytest.mark.parametrize("name", TRAINS)
@pytest.mark.parametrize("guidance,checkpointing", [(1.0, False), (2.5, True)])
def test_family_lora_gradient_matches_finite_differences(comfyui_pack, name, guidance, checkpointing):
    """The LoRA gradient through ComfyUI's denoiser path (CFG, the family's default targets, with and without
    gradient checkpointing) against central finite differences in float64 of the loss."""
    from comfy_test_pack.families import build_trainable as build
    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import LoraConfig

    patcher, pos, neg, shape = build(name)
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], [(pos, neg)], shape, gradient_checkpointing=checkpointing,
                          lora_cfg=LoraConfig(rank=2, alpha=2.0, targets=["auto"]))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in pol.lora.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    # Richardson: Mochi's 8192-wide MLP leaves a few percent of curvature in a plain 1e-2 difference; along the
    # gradient: a random direction's per-module derivatives can cancel (HunyuanVideo 1.5) below float32 round-off
    analytic, numeric = lora_gradient_and_difference(pol, shape, guidance, rows=2, richardson=True,
                                                     along_gradient=True)
    assert abs(analytic) > 1e-6
    assert analytic == pytest.approx(numeric, rel=2e-2, abs=1e-4)


@pytest.mark.parametrize("variant,kind", [("sd20_v", "v"), ("sdxl_edm", "v")])
def test_other_prediction_types_of_a_family_train_too(comfyui_pack, variant, kind):
    """SD2.x 768-v (v-prediction) and an SDXL v-prediction checkpoint on an EDM schedule: the same class as their
    family's eps instance, another sampling; one update through the step nodes' path changes the LoRA."""
    from comfy_test_pack.families import VARIANTS, build
    from treegrpo.comfyui.steps import RunState, backup_tree, sample_tree, train_step
    from treegrpo.config import AdvantageConfig, LoraConfig, OptimConfig, TreeConfig

    patcher, pos, neg, latent = build(variant)
    name, fam = F.family_of(patcher)
    assert F.sampling_kind(patcher) == kind and kind in fam.sampling.split(" / ")
    run = RunState.get(f"variant_{variant}", LoraConfig(rank=2, alpha=2.0, targets=["auto"]),
                       OptimConfig(lr=5e-2, kl_beta=0.0), 0, "off")
    with torch.inference_mode():
        tree = sample_tree(patcher, pos, neg, {"samples": torch.zeros(1, *latent)},
                           TreeConfig(steps=4, window_start=1, window_width=1, branch=2), seed=0, cfg=2.0,
                           scheduler="simple", trees=1, prompt="x", run=run)
        before = {k: v.clone() for k, v in run.trainer.lora_tensors("comfy").items()}
        tree = backup_tree(tree, {"rewards": {"r": _leaf_reward(tree.batch.leaves)}, "weights": {"r": 1.0}},
                           AdvantageConfig())
        train_step(tree, run)
    after = run.trainer.lora_tensors("comfy")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert variant in VARIANTS


# ---------------------------------------------------------------- video: a leaf's frames decoded and scored
def test_video_leaves_decode_a_few_frames_and_rewards_average_them(comfyui_pack):
    """Wan 2.1 text-to-video (tiny) with ComfyUI's real Wan VAE, through the Train node's code path
    (``train_full``): 9-frame videos (3 latent frames); the reward scores frames 0 and 4 of each leaf, so only the
    first two latent frames are decoded; each leaf's reward is the mean over those frames; the LoRA trains."""
    from comfy_test_pack.families import build, vae_for
    from treegrpo.comfyui.runtime import latent_shape_for
    from treegrpo.comfyui.train_node import train_full
    from treegrpo.config import TrainConfig

    patcher, pos, neg, _ = build("WAN21_T2V")
    vae = vae_for("WAN21_T2V")
    shape = latent_shape_for(patcher, 32, 32, vae.spacial_compression_decode(), 9, vae.temporal_compression_decode())
    assert shape == (16, 3, 4, 4)
    decoded, scored = [], []
    real_decode = vae.decode

    def spy_decode(latents, *a, **k):
        decoded.append(tuple(latents.shape))
        return real_decode(latents, *a, **k)

    vae.decode = spy_decode

    def reward(images, prompts):
        scored.append((images.detach().clone(), list(prompts)))
        return images.mean(dim=(1, 2, 3))

    cfg = TrainConfig(backend="comfy", prompts=["a fox"], guidance_scale=2.0, rewards=[{"name": "r", "weight": 1.0}],
                      tree={"steps": 4, "window_start": 1, "window_width": 1, "branch": 2},
                      lora={"rank": 2, "alpha": 2.0, "targets": ["auto"]}, optim={"lr": 5e-2, "kl_beta": 0.0},
                      iterations=1, prompts_per_iter=1, eval_every=0, checkpoint_every=0, run_name="video_wan21",
                      video={"frames": 9, "reward_frames": 2, "frame_stride": 4}, signals={"keep_best": False})
    with torch.inference_mode():
        trainer = train_full(patcher, vae, ["a fox"], [(pos, neg)], {"r": reward}, cfg, shape)
    assert decoded and all(s[2] == 2 for s in decoded if len(s) == 5), decoded   # latent frames 0-1 of 0-2
    images, prompts = scored[0]
    assert images.shape == (2 * 2, 3, 32, 32) and prompts == ["a fox"] * 4       # 2 leaves x 2 frames
    leaf_rewards = images.mean(dim=(1, 2, 3)).reshape(2, 2).mean(1)
    assert torch.allclose(torch.tensor(trainer.history[0]["reward"]), leaf_rewards.mean(), atol=1e-5)
    assert any(p.abs().sum() > 0 for n, p in trainer.lora.named_lora_parameters() if n.endswith(".up"))
    # the evaluation's samples (grids, previews, callbacks): each video's scored frames side by side
    with torch.inference_mode(False):
        ev = trainer.evaluate(prompts=["a fox"], seeds=1, return_images=True)
    assert ev["images"].shape == (1, 3, 32, 2 * 32 + 2) and torch.all(ev["images"][..., 32:34] == 1)


def test_the_memory_plan_measures_a_vae_comfyui_loaded_in_inference_mode(comfyui_pack, caplog):
    """ComfyUI runs its loader nodes in inference mode, so a loaded VAE's weights are inference tensors: the plan
    (any memory_budget_gb) measures the decode and the rewards without a graph, as the run decodes and scores its
    leaves (with one, every real VAE raised 'Inference tensors cannot be saved for backward')."""
    import logging

    from comfy_test_pack.families import build, vae_for
    from treegrpo.comfyui.runtime import latent_shape_for
    from treegrpo.comfyui.train_node import train_full
    from treegrpo.config import TrainConfig

    patcher, pos, neg, _ = build("WAN21_T2V")
    with torch.inference_mode():                  # as ComfyUI's VAELoader runs
        vae = vae_for("WAN21_T2V")
    shape = latent_shape_for(patcher, 16, 16, vae.spacial_compression_decode(), 5, vae.temporal_compression_decode())
    cfg = TrainConfig(backend="comfy", prompts=["a fox"], rewards=[{"name": "r", "weight": 1.0}],
                      tree={"steps": 3, "window_start": 1, "window_width": 1, "branch": 2},
                      lora={"rank": 2, "alpha": 2.0, "targets": ["auto"]}, optim={"kl_beta": 0.0},
                      iterations=1, prompts_per_iter=1, eval_every=0, checkpoint_every=0, run_name="plan_real_vae",
                      video={"frames": 5, "reward_frames": 2, "frame_stride": 4}, signals={"keep_best": False},
                      memory={"budget_gb": 64.0})
    with torch.inference_mode(), caplog.at_level(logging.INFO):
        trainer = train_full(patcher, vae, ["a fox"], [(pos, neg)], {"r": lambda im, p: im.mean(dim=(1, 2, 3))},
                             cfg, shape)
    assert trainer.iteration == 1
    assert [m for m in caplog.messages if m.startswith("TreeGRPO memory: planned peak")]


def test_a_vae_comfyui_loaded_decodes_the_leaves_tiled_or_whole(comfyui_pack):
    """A VAE loaded by a node (inference tensors) decodes the leaves plainly and tiled (the memory plan's choice or
    the tiled_decode widget) to the same frames, under the trainer's no_grad: ComfyUI 0.33's tiled decode finishes its
    output in place, which raised outside inference mode."""
    from comfy_test_pack.families import build, vae_for
    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import LoraConfig

    patcher, pos, neg, _ = build("WAN21_T2V")
    with torch.inference_mode():
        vae = vae_for("WAN21_T2V")
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], [(pos, neg)], (16, 3, 4, 4), vae=vae,
                          lora_cfg=LoraConfig(rank=2, alpha=2.0, targets=["auto"]))
        lat = torch.randn(2, 16, 3, 4, 4, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            whole = pol.decode(lat)
            assert pol.set_tiled_decode(True)
            tiled = pol.decode(lat)
    assert whole.shape == tiled.shape == (2, 3, 3, 32, 32) and not whole.is_inference()
    assert torch.allclose(whole, tiled, atol=2e-2)


def test_reward_scorer_averages_each_videos_frames(comfyui_pack):
    """The step graph's Reward Scorer on a VAEDecode batch of two 9-frame videos: frames 0, 4, 8 of each scored,
    one reward per video (their mean)."""
    Scorer = comfyui_pack.node_classes()["TreeGRPORewardScorer"]
    frames = torch.rand(18, 8, 8, 3, generator=torch.Generator().manual_seed(0))
    model = {"name": "mean", "model": lambda images, prompts: images.mean(dim=(1, 2, 3))}
    out = Scorer.execute(frames, model, "a fox", 1.0, frames_per_video=9, reward_frames=3, frame_stride=4)
    out = out.result[0] if hasattr(out, "result") else out[0]
    per_frame = frames.mean(dim=(1, 2, 3)).reshape(2, 9)[:, [0, 4, 8]]
    assert torch.allclose(out["rewards"]["mean"], per_frame.mean(1), atol=1e-6)


def test_the_step_graph_trains_a_video_model_from_vaedecodes_every_frame(comfyui_pack):
    """The step graph on Wan 2.1 (tiny) with ComfyUI's real Wan VAE, each node's execute as ComfyUI calls it: Tree
    Sampler → VAEDecode (every frame of every leaf: 2 leaves × 9 frames) → Reward Scorer (frames_per_video 9) →
    Advantage Backup → Tree Preview and Run Monitor (on the same decode) → Trainer Step; the LoRA trains. (The
    preview and the monitor refused VAEDecode's frames, a video user's walk.)"""
    import nodes as comfy_nodes
    from comfy_test_pack.families import build, vae_for

    def out(r):
        return r.result if hasattr(r, "result") else r

    classes = comfyui_pack.node_classes()
    patcher, pos, neg, _ = build("WAN21_T2V")
    with torch.inference_mode():
        vae = vae_for("WAN21_T2V")
        run, = out(classes["TreeGRPOTrainerState"].execute("video_steps", 2, 2.0, 5e-2, 1e-4, 0.0, 0))[:1]
        tree, latents = out(classes["TreeGRPOTreeSampler"].execute(
            patcher, pos, neg, {"samples": torch.zeros(1, 16, 3, 4, 4)}, 0, 2.0, "simple", 4, 1, 1, 2, 0.7, "fixed", 1,
            "a fox", run=run))[:2]
        images = comfy_nodes.VAEDecode().decode(vae, latents)[0]
        assert images.shape == (2 * 9, 32, 32, 3)                # what VAEDecode gives a video batch
        reward = {"name": "mean", "model": lambda im, p: im.mean(dim=(1, 2, 3))}
        rewards, = out(classes["TreeGRPORewardScorer"].execute(images, reward, "a fox", 1.0, frames_per_video=9,
                                                                 reward_frames=3, frame_stride=4))[:1]
        tree, _ = out(classes["TreeGRPOAdvantageBackup"].execute(tree, rewards, "softmax", 1.0, 0.0, 0.0))[:2]
        preview, = out(classes["TreeGRPOTreePreview"].execute(tree, images, rewards))[:1]
        monitor, = out(classes["TreeGRPORunMonitor"].execute(tree, images, rewards))[:1]
        assert preview.ndim == 4 and monitor.ndim == 4
        with pytest.raises(ValueError, match="got 17 images for the tree's 2 leaves .nor 2 whole videos"):
            classes["TreeGRPOTreePreview"].execute(tree, images[:17], rewards)
        out(classes["TreeGRPOTrainerStep"].execute(tree, run, patcher))
    assert any(p.abs().sum() > 0 for n, p in run.trainer.lora.named_lora_parameters() if n.endswith(".up"))


def test_train_node_sets_flux_guidance_and_flux_reads_it(comfyui_pack):
    """The Train node's ``guidance`` writes the embedded guidance into every conditioning (what FluxGuidance does;
    0 leaves the model's default), and a Flux model's output depends on it."""
    from comfy_test_pack.families import build_trainable as build
    from treegrpo.comfyui.demo import load_demo_comfy
    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.comfyui.train_node import encode     # what the Train node encodes its prompts with
    from treegrpo.config import LoraConfig

    _, clip, _ = load_demo_comfy()
    assert encode(clip, "a red circle", 4.0)[0][1]["guidance"] == 4.0
    assert "guidance" not in encode(clip, "a red circle", 0.0)[0][1]

    patcher, pos, _, shape = build("Flux")

    def denoised(g):
        cond = [[pos[0][0], dict(pos[0][1], guidance=g)]]
        with torch.inference_mode(False):
            pol = ComfyPolicy(patcher, ["p"], [(cond, None)], shape, lora_cfg=LoraConfig(rank=1, alpha=1.0,
                                                                                        targets=["auto"]))
            x = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0))
            return pol.run(lambda: pol.denoise(x, pol.sigmas(4)[[1]], pol.encode_prompts(["p"]), 1.0).clone())

    assert (denoised(1.0) - denoised(6.0)).abs().max() > 1e-5


@pytest.mark.parametrize("name", sorted(F.NO_BACKWARD))
def test_a_family_this_comfyui_cannot_backpropagate_is_refused_before_any_work(comfyui_pack, name):
    """Where the running ComfyUI computes a family's attention with a fused kernel that has no backward (Cosmos
    Predict2 on ComfyUI 0.33+), the Tree Sampler's check refuses it naming the kernel; elsewhere it trains (the family
    tests above)."""
    from comfy_test_pack.families import build

    reason = F.fused_without_backward(name)
    patcher = build(name)[0]
    if not reason:
        assert F.check_trainable(patcher) is F.FAMILIES[name]
        return
    with pytest.raises(F.FamilyError, match=rf"{name}\) on this ComfyUI: .*{F.NO_BACKWARD[name][1]}.*no backward"):
        F.check_trainable(patcher)
