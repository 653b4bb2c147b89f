"""Finite-difference checks of the LoRA gradient through ComfyUI's own denoiser path (ModelPatcher +
CFGGuider + sampling_function), for every architecture the tests train: the demo flow DiT, the SD1.x
UNet, SDXL's UNet, the SD3 MMDiT, Flux, Chroma, Qwen-Image and HunyuanVideo (5-D latents), with and without
gradient checkpointing. A wrong gradient (e.g. from in-place residual adds) fails here."""
import pytest
import torch

from lora_gradcheck import lora_gradient_and_difference

from treegrpo.config import LoraConfig


def _policy(arch, checkpointing=False):
    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy

    if arch == "demo":
        from treegrpo.comfyui.demo import load_demo_comfy
        patcher, clip, _ = load_demo_comfy()
        enc = lambda t: clip.encode_from_tokens_scheduled(clip.tokenize(t))  # noqa: E731
        conds, shape = [(enc("a red circle"), enc(""))], (3, 16, 16)
    else:
        from comfy_test_pack import _tiny
        patcher, pos, neg = _tiny(arch, 0)
        conds = [(pos, neg)]
        shape = (4, 8, 8) if arch in ("sd15", "sdxl") else (16, 1, 8, 8) if arch == "qwen_image" else \
            (16, 2, 8, 8) if arch == "hunyuan_video" else (16, 8, 8)
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], conds, shape, lora_cfg=LoraConfig(rank=2, alpha=2.0, targets=DEFAULT_TARGETS),
                          gradient_checkpointing=checkpointing)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in pol.lora.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return pol, shape


@pytest.mark.parametrize("arch", ["demo", "sd15", "sdxl", "sd3", "flux", "chroma", "qwen_image",
                                  "hunyuan_video"])
@pytest.mark.parametrize("guidance,checkpointing", [(1.0, False), (2.5, False), (2.5, True)])
def test_lora_gradient_matches_finite_differences(comfyui_pack, arch, guidance, checkpointing):
    pol, shape = _policy(arch, checkpointing)
    if checkpointing:
        from treegrpo.comfyui.policy import checkpoint_patches
        keys = checkpoint_patches(pol.patcher.model.diffusion_model)
        assert keys and set(keys) <= set(pol.patcher.object_patches)
    analytic, numeric = lora_gradient_and_difference(pol, shape, guidance)
    assert abs(analytic) > 1e-6
    assert analytic == pytest.approx(numeric, rel=3e-2, abs=1e-4)


def test_a_level_of_several_prompts_is_one_model_call(comfyui_pack):
    """The Train node's sampler merges the conds of all prompts of a tree level into one batched ComfyUI model
    call (the per-prompt fallback is for conds that cannot be merged, e.g. with areas or masks)."""
    import behaviour_fixture as bf
    import treegrpo.comfyui.policy as P

    results = []
    orig = P.rows_conds

    def spy(conds, groups, kind):
        out = orig(conds, groups, kind)
        results.append((kind, len(groups), out[1] and (out[0] is not None or kind == "negative")))
        return out

    P.rows_conds = spy
    try:
        comfyui_pack.execute(bf.train_node_graph("one_call_per_level", 1))
    finally:
        P.rows_conds = orig
    multi = [r for r in results if r[1] > 1]
    assert multi and all(ok for _, _, ok in multi), results[:6]


def test_treegrpo_loras_stack_on_a_patched_model(comfyui_pack):
    """A model that already carries a TreeGRPO LoRA (the Train node's output) keeps it when another LoRA is
    installed on top (a new run, or the Tree Sampler's untrained one): the object patches chain."""
    from treegrpo.comfyui.demo import load_demo_comfy
    from treegrpo.comfyui.policy import ComfyLoRA
    from treegrpo.config import LoraConfig

    patcher, _, _ = load_demo_comfy()
    dm = patcher.model.diffusion_model
    cfg = LoraConfig(rank=2, alpha=2.0, targets=["to_q"])
    with torch.inference_mode(False):
        l1, l2 = ComfyLoRA(dm, cfg, seed=1), ComfyLoRA(dm, cfg, seed=2)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for lora in (l1, l2):
                for p in lora.up.values():
                    p.copy_(torch.randn(p.shape, generator=g))
        m1 = patcher.clone()
        l1.patch(m1)
        m2 = m1.clone()
        l2.patch(m2)
        name = l1.names[0]
        lin = dict(dm.named_modules())[name]
        x = torch.randn(3, lin.in_features, generator=g)
        k = ComfyLoRA._key(name)

        def delta(lora):
            return lora.scale * (x @ lora.down[k].T @ lora.up[k].T)

        with torch.no_grad():
            out = m2.object_patches[f"diffusion_model.{name}.forward"](x)
            want = lin(x) + delta(l1) + delta(l2)
    assert torch.allclose(out, want, atol=1e-5)
    assert not torch.allclose(out, lin(x) + delta(l2), atol=1e-3)      # the first LoRA was not dropped


@pytest.mark.parametrize("arch", ["sd15", "sdxl", "sd3", "flux", "chroma", "qwen_image", "hunyuan_video"])
def test_checkpointing_keeps_far_fewer_activations_and_no_copies(comfyui_pack, arch):
    """Measured with saved-tensor hooks: the activations autograd keeps for backward (weights excluded) with
    gradient checkpointing are under half the plain pass's; families with in-place residual adds (Flux, Chroma)
    copy their saved activations only without checkpointing. Tiny models, 4 rows: 11.3 -> 0.7 MB SD1.x,
    1.0 -> 0.2 MB SD3, 2.0 -> 0.2 MB Flux, 3.0 -> 1.4 MB Chroma (one block of each kind, so its guidance
    approximator, which runs outside the blocks, is a large share here; at real depth the blocks dominate)."""
    kept = {}
    for checkpointing in (False, True):
        pol, shape = _policy(arch, checkpointing)
        assert pol.snapshot_activations == (arch in ("flux", "chroma", "qwen_image", "hunyuan_video") and
                                            not checkpointing)
        g = torch.Generator().manual_seed(1)
        x = torch.randn((4, *shape), generator=g)
        sigma, cond = pol.sigmas(10)[[2, 3, 4, 5]], pol.encode_prompts(["p"] * 4)
        total = [0]

        def pack(t):
            if t.grad_fn is not None:   # an activation, not a weight
                total[0] += t.numel() * t.element_size()
            return t

        def forward():
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                return pol.denoise(x, sigma, cond, 1.0)

        pol.run(forward)
        kept[checkpointing] = total[0]
    assert 0 < kept[True] < kept[False] / 2, kept


def _stored_dtype(w):
    """The dtype a weight is stored in (ComfyUI 0.33's quantized layers hold a QuantizedTensor of float32 view)."""
    inner = getattr(w, "_qdata", None)
    return inner.dtype if inner is not None else w.dtype


def _scaled_fp8_as_newer_comfyui_loads_it(ref, fp8):
    """ComfyUI 0.33+ reads an old scaled-fp8 checkpoint (``scaled_fp8`` marker, fp8 ``weight`` and float32
    ``scale_weight`` per Linear) as quantized layers (``comfy.utils.convert_old_quants`` → ``comfy_quant`` metadata →
    mixed-precision ops): the same steps as ``comfy.sd.load_diffusion_model_state_dict``, on the tiny Flux. The
    reference ``ref`` gets the dequantised weights (what the quantized forward computes)."""
    import comfy.supported_models as sm
    import comfy.utils

    dm = ref.model.diffusion_model
    linear = {n for n, m in dm.named_modules() if isinstance(m, torch.nn.Linear)}
    old = {"scaled_fp8": torch.empty(0, dtype=fp8)}
    with torch.no_grad():
        for k, t in dm.state_dict().items():
            layer = k.rsplit(".", 1)[0]
            if k.endswith(".weight") and layer in linear:
                scale = t.abs().max().clamp_min(1e-12) / torch.finfo(fp8).max
                old[k], old[f"{layer}.scale_weight"] = (t / scale).to(fp8), scale.reshape(())
                t.copy_(old[k].float() * scale)
            else:
                old[k] = t.clone()
    sd, _ = comfy.utils.convert_old_quants(old, "")
    cfg = sm.Flux(dict(ref.model.model_config.unet_config))
    cfg.quant_config = comfy.utils.detect_layer_quantization(sd, "")
    assert cfg.quant_config, "convert_old_quants made no quantized layer"
    import comfy.model_management as mm
    dev = mm.get_torch_device()   # dtypes as load_diffusion_model_state_dict picks them (float32 compute where it picks none)
    cfg.set_inference_dtype(mm.unet_dtype(supported_dtypes=list(cfg.supported_inference_dtypes), weight_dtype=None),
                            mm.unet_manual_cast(None, dev, cfg.supported_inference_dtypes) or torch.float32,
                            device=dev)
    model = cfg.get_model(sd)
    model.load_model_weights(sd, "")
    return model


@pytest.mark.parametrize("weight_dtype,scaled", [(torch.float8_e4m3fn, False), (torch.float8_e5m2, False),
                                                 (torch.float8_e4m3fn, True)])
def test_fp8_base_weights_train_a_float32_lora(comfyui_pack, weight_dtype, scaled):
    """fp8 base weights as ComfyUI loads them: ``UNETLoader``'s ``weight_dtype`` fp8 (weights stored in fp8, cast
    to the compute dtype per layer by ``comfy.ops.manual_cast``) and checkpoints with scaled fp8 weights
    (``scaled_fp8``: fp8 weight × a float32 ``scale_weight`` per Linear). The LoRA stays float32, the sampler and the
    update run, and the LoRA gradient equals the one through the same weights dequantised to float32: both
    compute in float32 from identical values, so the tolerance is float32 round-off (rel 1e-5), far below what
    fp8 rounding of the weights themselves would change (percents)."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm
    from comfy_test_pack import _tiny

    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy

    import comfy.utils

    ref, pos, neg = _tiny("flux", 0)
    if scaled and hasattr(comfy.utils, "convert_old_quants"):
        m8 = _scaled_fp8_as_newer_comfyui_loads_it(ref, weight_dtype)
        sd = None
    else:
        cfg = sm.Flux(dict(ref.model.model_config.unet_config))
        if scaled:
            cfg.scaled_fp8 = weight_dtype
        cfg.set_inference_dtype(weight_dtype, torch.float32)
        m8 = cfg.get_model({})
        sd = ref.model.diffusion_model.state_dict()
    with torch.no_grad():
        if sd is not None:
            scaled_weights = set()
            for name, mod in m8.diffusion_model.named_modules():
                if hasattr(mod, "scale_weight"):        # a checkpoint's scaled fp8 Linear: w ≈ fp8(w / s) · s
                    w = sd[f"{name}.weight"]
                    scale = w.abs().max().clamp_min(1e-12) / torch.finfo(weight_dtype).max
                    mod.weight.copy_((w / scale).to(weight_dtype))
                    mod.scale_weight.copy_(scale)
                    sd[f"{name}.weight"].copy_(mod.weight.float() * mod.scale_weight)   # what its forward computes
                    scaled_weights.add(f"{name}.weight")
            assert scaled_weights if scaled else not scaled_weights
            for k, t in m8.diffusion_model.state_dict().items():
                if k in scaled_weights or k.endswith(("scale_weight", "scale_input")):
                    continue
                t.copy_(sd[k].to(t.dtype))
                sd[k].copy_(t.float())                   # the reference holds exactly the fp8 values, in float32
    assert _stored_dtype(m8.diffusion_model.double_blocks[0].img_attn.qkv.weight) == weight_dtype
    p8 = comfy.model_patcher.ModelPatcher(m8, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())

    grads = {}
    for name, patcher in (("fp8", p8), ("fp32", ref)):
        with torch.inference_mode(False):
            pol = ComfyPolicy(patcher, ["p"], [(pos, neg)], (16, 8, 8),
                              lora_cfg=LoraConfig(rank=2, alpha=2.0, targets=DEFAULT_TARGETS))
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in pol.lora.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        assert all(p.dtype == torch.float32 and p.requires_grad for p in pol.lora.parameters())
        x = torch.randn((2, 16, 8, 8), generator=g)
        sigma, cond = pol.sigmas(10)[[2, 5]], pol.encode_prompts(["p", "p"])
        w = torch.randn((2, 16, 8, 8), generator=g)

        def backward():
            with torch.enable_grad():
                (pol.denoise(x, sigma, cond, 1.0).double() * w).sum().backward()

        pol.run(backward)
        grads[name] = torch.cat([p.grad.flatten() for p in pol.lora.parameters()])
        if name == "fp8":   # the weights stayed fp8 through ComfyUI's loading, and a tree samples on them
            from treegrpo.config import TreeConfig
            from treegrpo.tree import sample_trees

            assert _stored_dtype(pol.patcher.model.diffusion_model.double_blocks[0].img_attn.qkv.weight) == weight_dtype
            tb = pol.run(lambda: sample_trees(pol, ["p"], TreeConfig(steps=4, window_start=1, window_width=2),
                                              generator=torch.Generator().manual_seed(0)))
            assert tb.leaves.dtype == torch.float32 and torch.isfinite(tb.leaves).all() and tb.nfe == 1 + 1 + 2 + 4
    assert grads["fp8"].abs().max() > 0
    assert torch.allclose(grads["fp8"], grads["fp32"], rtol=1e-5, atol=1e-7), \
        float((grads["fp8"] - grads["fp32"]).abs().max())


def test_a_dynamic_vram_patcher_is_trained_through_its_non_dynamic_delegate(comfyui_pack):
    """ComfyUI 0.33+ gives NVIDIA users a ``ModelPatcherDynamic`` (weights streamed per op, ``is_dynamic()``); on a
    CPU ComfyUI never makes one, so a patcher that reports ``is_dynamic()`` stands in: the policy trains on what
    ``get_non_dynamic_delegate()`` returns (plain weights), with the LoRA gradient of the plain patcher; a patcher
    whose loader cannot reload it is refused with what to do."""
    import comfy.model_patcher as cmp
    from comfy_test_pack import _tiny

    from treegrpo.comfyui import families as F
    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy

    plain, pos, neg = _tiny("flux", 0)
    calls = []

    class Dynamic(cmp.ModelPatcher):
        def is_dynamic(self):
            return True

        def get_non_dynamic_delegate(self):
            calls.append("delegate")
            return cmp.ModelPatcher.clone(plain)

    dyn = Dynamic(plain.model, plain.load_device, plain.offload_device)
    grads = {}
    for name, patcher in (("dynamic", dyn), ("plain", plain)):
        with torch.inference_mode(False):
            pol = ComfyPolicy(patcher, ["p"], [(pos, neg)], (16, 8, 8),
                              lora_cfg=LoraConfig(rank=2, alpha=2.0, targets=DEFAULT_TARGETS))
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in pol.lora.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        assert not getattr(pol.patcher, "is_dynamic", lambda: False)()
        x, w = torch.randn((2, 16, 8, 8), generator=g), torch.randn((2, 16, 8, 8), generator=g)

        def backward():
            with torch.enable_grad():
                (pol.denoise(x, pol.sigmas(10)[[2, 5]], pol.encode_prompts(["p", "p"]), 1.0).double() * w).sum().backward()

        pol.run(backward)
        grads[name] = torch.cat([p.grad.flatten() for p in pol.lora.parameters()])
    assert calls == ["delegate"]
    assert torch.equal(grads["dynamic"], grads["plain"]) and grads["plain"].abs().max() > 0

    class NoReload(Dynamic):
        def get_non_dynamic_delegate(self):
            raise RuntimeError("Cannot create non-dynamic delegate: cached_patcher_init is not initialized.")

    with torch.inference_mode(False), pytest.raises(F.FamilyError, match="--disable-dynamic-vram"):
        ComfyPolicy(NoReload(plain.model, plain.load_device, plain.offload_device), ["p"], [(pos, neg)],
                    (16, 8, 8), lora_cfg=LoraConfig(rank=2, alpha=2.0, targets=DEFAULT_TARGETS))
    if hasattr(cmp, "ModelPatcherDynamic"):   # ComfyUI 0.33+: the API the policy relies on is there
        import inspect
        assert hasattr(cmp.ModelPatcherDynamic, "get_non_dynamic_delegate")
        assert cmp.ModelPatcherDynamic.is_dynamic(None) is True
        assert "disable_dynamic" in inspect.signature(cmp.ModelPatcher.clone).parameters
