"""Policy adapter for ComfyUI models (a ``ModelPatcher``), through ComfyUI's own denoiser path.

Imported only inside ComfyUI. Sampling and training forwards run inside ``CFGGuider.sample`` with a
custom ``comfy.samplers.Sampler`` (as ComfyUI's own LoRA trainer does), so model loading
(``load_models_gpu``), patches, hooks and CFG are ComfyUI's: one code path for SD1.x/SDXL (epsilon,
v-prediction) and SD3.x/Flux (flow) models.

LoRA is applied in activation space per patcher: each target Linear's ``forward`` gets an object patch
``y = W·x + (alpha/r)·up(down(x))`` (``ModelPatcher.add_object_patch``), so the shared base model is
never modified and other patchers (and LoraLoader on top) keep working.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..config import LoraConfig, VideoConfig
from ..video import frame_indices, latent_prefix, video_length
from ..lora import LoraWeights, is_target
from ..policy import Policy
from ..saved_tensors import copy_on_write_saved
from . import families

#: Linear-module name suffixes that get LoRA when a model's family names none (families.py has each family's)
DEFAULT_TARGETS = list(families.DEFAULT_TARGETS)


def is_linear(module: nn.Module) -> bool:
    """A Linear layer of a ComfyUI model: ``nn.Linear`` or one of ComfyUI's Linear ops that is not one (ComfyUI 0.33's
    mixed-precision ``Linear``, which quantized checkpoints such as scaled fp8 load into, derives from ``nn.Module``)."""
    return isinstance(module, nn.Linear) or (type(module).__name__ == "Linear" and isinstance(
        getattr(module, "in_features", None), int) and isinstance(getattr(module, "out_features", None), int))


class ComfyLoRA(nn.Module):
    """Activation-space LoRA over the Linear layers of a ComfyUI ``diffusion_model``.

    ``down`` (r, in) is Kaiming-uniform initialised and ``up`` (out, r) zero (as PEFT), so a fresh
    adapter is the identity. Module names are relative to ``diffusion_model`` (ComfyUI LoRA keys are
    ``diffusion_model.<name>.lora_up.weight``)."""

    def __init__(self, diffusion_model: nn.Module, cfg: LoraConfig, device=None, seed: int = 0):
        super().__init__()
        targets = list(cfg.targets)
        self.names = [n for n, m in diffusion_model.named_modules() if is_linear(m) and is_target(n, targets)]
        if not self.names:
            lin = [n for n, m in diffusion_model.named_modules() if is_linear(m)][:8]
            raise ValueError(f"LoRA targets {targets} match no Linear layer of this model; some Linear names: {lin}")
        self.rank, self.alpha = cfg.rank, float(cfg.alpha)
        self.enabled = True
        g = torch.Generator().manual_seed(seed)
        self.down, self.up = nn.ParameterDict(), nn.ParameterDict()
        mods = dict(diffusion_model.named_modules())
        for n in self.names:
            lin = mods[n]
            d = torch.empty(cfg.rank, lin.in_features)
            bound = 1 / math.sqrt(lin.in_features)  # kaiming_uniform(a=sqrt(5)) as nn.Linear / PEFT
            d.uniform_(-bound, bound, generator=g)
            self.down[self._key(n)] = nn.Parameter(d.to(device) if device is not None else d)
            self.up[self._key(n)] = nn.Parameter(torch.zeros(lin.out_features, cfg.rank, device=device))

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "__")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def forward_patch(self, module: nn.Linear, name: str, inner: Optional[Callable] = None) -> Callable:
        """The replacement ``forward`` of one Linear: ``inner`` (an object patch already on that forward, e.g. a
        trained TreeGRPO LoRA the model came with) or the class's own forward, then this LoRA added."""
        orig = inner if inner is not None else functools.partial(type(module).forward, module)
        k = self._key(name)

        def forward(x, *args, **kwargs):
            y = orig(x, *args, **kwargs)
            if not self.enabled:
                return y
            d, u = self.down[k], self.up[k]
            h = torch.nn.functional.linear(torch.nn.functional.linear(x.to(d.device, d.dtype), d), u)
            return y + (self.scale * h).to(y.dtype)

        return forward

    def patch(self, model_patcher) -> None:
        """Install the LoRA on ``model_patcher`` (a clone owned by the caller) as object patches, on top of any
        object patch already there (LoRAs stack instead of replacing each other)."""
        mods = dict(model_patcher.model.diffusion_model.named_modules())
        for n in self.names:
            key = f"diffusion_model.{n}.forward"
            model_patcher.add_object_patch(key, self.forward_patch(mods[n], n, model_patcher.object_patches.get(key)))

    def named_lora_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(<module>.down | <module>.up, parameter)`` in ``parameters()`` order: the backend-neutral names
        checkpoints use (the same as :class:`treegrpo.lora.PeftLoRA`'s)."""
        keys = {self._key(n): n for n in self.names}
        return [(f"{keys[k]}.{kind}", p) for kind, d in (("down", self.down), ("up", self.up)) for k, p in d.items()]

    def weights(self) -> LoraWeights:
        down = {n: self.down[self._key(n)].detach().float().cpu().clone() for n in self.names}
        up = {n: self.up[self._key(n)].detach().float().cpu().clone() for n in self.names}
        return LoraWeights(down, up, {n: self.alpha for n in self.names})

    def load(self, w: LoraWeights) -> None:
        from ..lora import LoraFileError, with_alpha
        missing = sorted(set(self.names) - set(w.down))
        extra = sorted(set(w.down) - set(self.names))
        if extra or missing:
            raise LoraFileError(f"LoRA modules do not match this model (missing {missing[:3]}, unknown {extra[:3]}): "
                                "was it trained for another base model or other targets?")
        w = with_alpha(w, float(w.alpha[self.names[0]]))     # one alpha here: the others' ups rescaled to it
        with torch.no_grad():
            for n in self.names:
                k = self._key(n)
                if self.down[k].shape != w.down[n].shape or self.up[k].shape != w.up[n].shape:
                    raise LoraFileError(f"LoRA shape mismatch at {n}: file {tuple(w.down[n].shape)}/"
                                        f"{tuple(w.up[n].shape)} vs model {tuple(self.down[k].shape)}/"
                                        f"{tuple(self.up[k].shape)} (another base model or rank?)")
                self.down[k].copy_(w.down[n])
                self.up[k].copy_(w.up[n])
                self.alpha = float(w.alpha[n])


def trainable_patcher(model_patcher):
    """A clone of ``model_patcher`` whose weights autograd can keep for backward.

    ComfyUI 0.33+ hands NVIDIA users a Dynamic VRAM patcher (``ModelPatcherDynamic``, ``is_dynamic()``): each op
    streams its weight into pages that are unpinned and reused as soon as the op returns, so a weight autograd saved
    could be overwritten before backward, silently. The pack trains on the patcher's non-dynamic delegate instead:
    the same model loaded with plain weights by the loader that made it (ComfyUI caches it on the patcher, so later
    phases and runs reuse it). Object patches (LoRAs already on the model) come along, as with ``clone()``."""
    if getattr(model_patcher, "is_dynamic", lambda: False)():
        try:
            return model_patcher.get_non_dynamic_delegate()
        except (RuntimeError, AttributeError) as e:
            raise families.FamilyError(
                "this model came from a loader that cannot reload it without ComfyUI's Dynamic VRAM, and TreeGRPO "
                f"trains on plain weights ({e}): load it with a core loader (Load Checkpoint, Load Diffusion Model) "
                "or start ComfyUI with --disable-dynamic-vram") from e
    return model_patcher.clone()


def make_trainable_tensors(module: nn.Module) -> int:
    """Replace inference-mode parameters/buffers (made by loader nodes under the executor's
    ``inference_mode``) with normal clones, so autograd can save them for backward, and freeze every base
    weight (a model loaded outside inference mode would otherwise get full-size weight gradients: as much
    memory again as its weights). Returns the count of clones."""
    n = 0
    with torch.inference_mode(False):
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and p.is_inference():
                    m._parameters[name] = nn.Parameter(p.clone(), requires_grad=False)
                    n += 1
                elif p is not None and p.requires_grad:
                    p.requires_grad_(False)
            for name, b in list(m._buffers.items()):
                if b is not None and b.is_inference():
                    m._buffers[name] = b.clone()
                    n += 1
    return n


#: ComfyUI diffusion-model modules whose blocks add residuals in place (``img += …``) after saving them: plain
#: autograd refuses them, so their training forward runs copy-on-write (docs/design.md §3).
INPLACE_RESIDUAL_MODULES = ("comfy.ldm.flux.", "comfy.ldm.chroma.", "comfy.ldm.hunyuan_video.", "comfy.ldm.qwen_image.",
                            "comfy.ldm.lightricks.", "comfy.ldm.chroma_radiance.")


def has_inplace_residuals(diffusion_model: nn.Module) -> bool:
    return type(diffusion_model).__module__.startswith(INPLACE_RESIDUAL_MODULES)


@contextlib.contextmanager
def comfy_training_flag(on: bool = True):
    """Set ComfyUI's ``comfy.model_management.in_training`` for a forward whose graph will be backpropagated.

    ComfyUI 0.33+ routes RoPE (Flux, Chroma, Qwen-Image, Wan, HunyuanVideo, Lumina 2, Z-Image, HiDream, …) and a
    few other ops to comfy-kitchen's fused kernels, which have no backward, unless this flag is set (its own LoRA
    trainer sets it). Forwards without gradients (sampling, the KL reference) keep the fused kernels. Restored on
    any exit, an error or an interrupt included. ComfyUI before 0.33 has no such flag: nothing to do."""
    import comfy.model_management as mm

    if not on or not hasattr(mm, "in_training"):
        yield
        return
    was = mm.in_training
    mm.in_training = True
    try:
        yield
    finally:
        mm.in_training = was


@contextlib.contextmanager
def _recomputation():
    with copy_on_write_saved() as mode, comfy_training_flag():
        yield mode


def _recompute_copy_on_write():
    """``torch.utils.checkpoint``'s ``context_fn``: the forward as it is; the recomputation (in backward, after the
    forward's training flag was restored) copy-on-write and with ComfyUI's training flag set again."""
    return contextlib.nullcontext(), _recomputation()


def checkpoint_patches(diffusion_model: nn.Module, enabled: Callable[[], bool] = lambda: True) -> dict[str, Callable]:
    """Object patches (``diffusion_model.<block>.forward``) that recompute each transformer/UNet block in
    backward (``torch.utils.checkpoint``, non-reentrant) while gradients are on and ``enabled()``. Blocks are the items of the
    model's top-level ModuleLists and ModuleDicts (Cosmos' blocks) and of ``middle_block``; Sequential containers are checkpointed per
    child because ComfyUI's UNet iterates them instead of calling them. Each block runs on clones of its
    tensor inputs, so blocks that add residuals in place (Flux) cannot change what the recomputation starts from,
    and the recomputation runs under :func:`~treegrpo.saved_tensors.copy_on_write_saved`, so an in-place update
    inside the block (Flux/Chroma's ``img += …`` after ``img_norm2(img)`` saved ``img``) cannot change what it
    saved: without it checkpointing would read the updated tensor in backward, silently (issue 30)."""
    from torch.utils.checkpoint import checkpoint

    blocks: list[tuple[str, nn.Module]] = []
    for name, child in diffusion_model.named_children():
        items = list(child.named_children()) if isinstance(child, (nn.ModuleList, nn.ModuleDict)) else \
            [("", child)] if name == "middle_block" else []
        for sub, blk in items:
            path = f"{name}.{sub}" if sub else name
            if isinstance(blk, nn.Sequential):
                blocks += [(f"{path}.{i}", m) for i, m in blk.named_children()]
            else:
                blocks.append((path, blk))

    def make(blk: nn.Module) -> Callable:
        orig = type(blk).forward

        def run(*args, **kwargs):
            # Flux/Chroma pass img/txt by keyword and add residuals to them in place: clone those too
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            return orig(blk, *args, **kwargs)

        def forward(*args, **kwargs):
            if not torch.is_grad_enabled() or not enabled():
                return orig(blk, *args, **kwargs)
            # callers mutate shared option dicts (ComfyUI's transformer_options: block index/type) after the
            # block returns: the recomputation must see them as they were
            kwargs = {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}
            return checkpoint(run, *args, use_reentrant=False, context_fn=_recompute_copy_on_write, **kwargs)

        return forward

    return {f"diffusion_model.{p}.forward": make(b) for p, b in blocks}


class ComfyPolicy(Policy):
    """A ComfyUI ``ModelPatcher`` (+ VAE, + per-prompt conditionings) behind the Policy protocol.

    ``conds``: one ``(positive, negative)`` CONDITIONING pair per prompt in ``prompts``.
    Call the sampler/update inside :meth:`run`, which opens ComfyUI's sampling context."""

    decode_batch = 1  # ComfyUI's VAE batches (and tiles) by the memory it finds free
    tiled_decode = False

    def __init__(self, model_patcher, prompts: list[str], conds: list[tuple[Any, Any]], latent_shape: tuple,
                 *, vae=None, lora_cfg: Optional[LoraConfig] = None, scheduler: str = "simple", seed: int = 0,
                 lora: Optional[ComfyLoRA] = None, gradient_checkpointing: bool = False,
                 video: Optional[VideoConfig] = None):
        import comfy.samplers

        if len(prompts) != len(conds):
            raise ValueError(f"{len(prompts)} prompts but {len(conds)} conditionings")
        if scheduler not in comfy.samplers.SCHEDULER_NAMES:
            raise ValueError(f"unknown scheduler {scheduler!r}; ComfyUI has {comfy.samplers.SCHEDULER_NAMES}")
        self.base = model_patcher
        self.patcher = trainable_patcher(model_patcher)
        families.check_trainable(self.patcher)
        self.prediction = families.prediction_of(self.patcher)
        self.device = torch.device(self.patcher.load_device)
        with torch.inference_mode(False):
            self.lora = lora if lora is not None else ComfyLoRA(self.patcher.model.diffusion_model,
                                                                 self._lora_cfg(lora_cfg),
                                                                 device=self.device, seed=seed)
        self.lora.patch(self.patcher)
        # gradient checkpointing (−memory, +time) is switched per call: the memory plan may turn it on
        self.gradient_checkpointing = bool(gradient_checkpointing)
        ckpt = checkpoint_patches(self.patcher.model.diffusion_model, lambda: self.gradient_checkpointing)
        for key, fn in ckpt.items():
            self.patcher.add_object_patch(key, fn)
        self.checkpointing_refusal = families.checkpointing_refusal(self.patcher)
        if gradient_checkpointing and self.checkpointing_refusal:
            raise families.FamilyError(self.checkpointing_refusal)
        self._can_checkpoint = bool(ckpt) and not self.checkpointing_refusal
        self._inplace = has_inplace_residuals(self.patcher.model.diffusion_model)
        self.model = self.lora  # trainable parameters live here
        self.prompts = list(prompts)
        self._index = {p: i for i, p in enumerate(self.prompts)}
        self.conds = conds
        self.vae = vae
        self.scheduler = scheduler
        self.seed = seed
        self.video = video or VideoConfig()
        self._shape = tuple(int(s) for s in latent_shape)
        self._wrap = None
        self._extra: dict = {}
        self.guider = _make_guider(self.patcher, conds)

    def check_window(self, tree) -> None:
        """Before any tree is sampled: a σ-space model's (SD1.x / SDXL, DDIM) SDE window must end before the last
        step, where its step adds no noise (:class:`treegrpo.config.ConfigError` saying what to change)."""
        if self.prediction == "epsilon":
            from ..run import check_window_before_last_step
            check_window_before_last_step(tree, moving_fix="use more steps, or the fixed window")

    def _lora_cfg(self, cfg: Optional[LoraConfig]) -> LoraConfig:
        """``cfg`` with ``targets: [auto]`` (or no config) resolved to the model family's defaults."""
        import dataclasses
        cfg = cfg or LoraConfig(targets=["auto"])
        return dataclasses.replace(cfg, targets=families.resolve_targets(cfg.targets, self.patcher))

    @property
    def snapshot_activations(self) -> bool:
        """Blocks that add residuals in place need their saved activations protected (copy-on-write) in a plain
        training forward; with checkpointing the recomputation of every block is copy-on-write already."""
        return self._inplace and not self.gradient_checkpointing

    def set_gradient_checkpointing(self, on: bool) -> bool:
        self.gradient_checkpointing = bool(on) and self._can_checkpoint
        return self._can_checkpoint

    def prepare_memory_probe(self) -> None:
        if self.vae is not None:
            import comfy.model_management
            comfy.model_management.load_models_gpu([self.vae.patcher])

    def probe_decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The VAE's decoder on ``latents`` (B, C, H, W) → (B, 3, H', W'), with the model where it is."""
        if self.vae is None:
            raise ValueError("no VAE given: connect a VAE to decode the leaves")
        if self.tiled_decode:   # ComfyUI's tiled decode (the VAE is loaded already: prepare_memory_probe)
            return self.decode(latents)
        raw = self.patcher.model.process_latent_out(latents.float())
        out = self.vae.first_stage_model.decode(raw.to(self.vae.device, self.vae.vae_dtype)).float()
        return out[:, :, 0] if out.ndim == 5 else out   # video VAEs: (B, 3, T, H, W); the reward sees frame 0

    def set_tiled_decode(self, on: bool) -> bool:
        can = self.vae is not None and hasattr(self.vae, "decode_tiled")
        self.tiled_decode = bool(on) and can
        return can

    def denoiser_parameters(self) -> int:
        return sum(p.numel() for p in self.patcher.model.diffusion_model.parameters())

    def save_diffusers_lora(self, w: LoraWeights, path: str, metadata: Optional[dict] = None) -> Optional[str]:
        """``w`` in diffusers' keys for ``pipe.load_lora_weights`` (:mod:`treegrpo.comfyui.diffusers_lora`); None
        for a family without a twin. Raises ``NoDiffusersLayout`` for a LoRA on a layer diffusers has no one
        counterpart of."""
        from . import diffusers_lora
        return diffusers_lora.save(w, self.patcher.model, path)

    def memory_signature(self) -> dict:
        """The denoiser's and the VAE's shapes and dtypes, the LoRA's, the dtype ComfyUI computes in, its version and
        the attention it chose at start (its launch flags): what the fake probe's peaks depend on."""
        import comfy.ldm.modules.attention as attention
        import comfy.model_management as mm

        from ..memory_cache import module_signature
        from .versions import running_version
        base = self.patcher.model
        return {"denoiser": module_signature(base.diffusion_model), "lora": module_signature(self.model),
                "vae": module_signature(self.vae.first_stage_model) if self.vae is not None else None,
                "compute_dtype": str(getattr(base, "manual_cast_dtype", None) or base.get_dtype()),
                "comfyui": running_version(), "vram_state": str(getattr(mm, "vram_state", "")),
                "attention": getattr(getattr(attention, "optimized_attention", None), "__name__", None)}

    def memory_weights(self) -> dict[str, int]:
        out = {"denoiser": int(self.patcher.model_size())}
        if self.vae is not None:
            out["vae"] = int(self.vae.patcher.model_size())
        return out

    # ---- Policy protocol
    def sigmas(self, steps: int) -> torch.Tensor:
        import comfy.samplers
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        ms = self.patcher.get_model_object("model_sampling")
        with unset_fake_temporarily():   # ComfyUI reads the schedule as numbers, also inside a memory probe
            return comfy.samplers.calculate_sigmas(ms, self.scheduler, steps).float().cpu()

    def latent_shape(self):
        return self._shape

    def noise_scaling(self, sigma, noise):
        """ComfyUI's initial latent for pure noise (``model_sampling.noise_scaling`` with max denoise)."""
        ms = self.patcher.get_model_object("model_sampling")
        s = torch.as_tensor(sigma, dtype=torch.float32, device=noise.device).reshape(1)
        return ms.noise_scaling(s, noise, torch.zeros_like(noise), max_denoise=True)

    def encode_prompts(self, prompts: list[str], negative: str = "") -> dict:
        unknown = [p for p in prompts if p not in self._index]
        if unknown:
            raise ValueError(f"prompts {unknown[:3]} have no conditioning in this ComfyPolicy")
        return {"prompt_idx": torch.tensor([self._index[p] for p in prompts], dtype=torch.long)}

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, cond: dict, cfg: float) -> torch.Tensor:
        if self._wrap is None:
            raise RuntimeError("ComfyPolicy.denoise called outside ComfyPolicy.run(...)")
        idx = cond["prompt_idx"].tolist()
        groups, a = [], 0
        for b in range(1, len(idx) + 1):
            if b == len(idx) or idx[b] != idx[a]:
                groups.append((a, b, idx[a]))
                a = b
        self.guider.groups = groups
        self.guider.cfg = cfg
        with comfy_training_flag(torch.is_grad_enabled()):
            out = self._wrap(x.to(self.device), sigma.to(self.device), **self._extra)
        return out if out.dtype in (torch.float32, torch.float64) else out.float()   # fp16/bf16 models: float32

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Leaves → images (B, 3, H, W) in [0, 1]; video leaves (B, C, T, H, W) with T > 1 → the frames the rewards
        score, (B, F, 3, H, W) (``self.video``: ``reward_frames`` frames ``frame_stride`` apart), decoding only the
        latent frames up to the last of them (video VAEs are causal in time)."""
        if self.vae is None:
            raise ValueError("no VAE given: connect a VAE to decode the leaves")
        raw = self.patcher.model.process_latent_out(latents.float())
        picks = None
        if raw.ndim == 5 and raw.shape[2] > 1:
            tc = self.vae.temporal_compression_decode() or 1
            picks = frame_indices(video_length(raw.shape[2], tc), self.video.reward_frames, self.video.frame_stride)
            raw = raw[:, :, :latent_prefix(picks, tc)]
        # as ComfyUI's VAEDecode runs it, in inference mode: ComfyUI 0.33's tiled decode builds its output there and
        # finishes it in place (outside, a VAE loaded by a node raised "Inplace update to inference tensor")
        with torch.inference_mode():
            images = (self.vae.decode_tiled if self.tiled_decode else self.vae.decode)(raw)  # (B, [T,] H, W, 3)
            if images.ndim == 5:  # video VAEs: (B, T, H, W, C)
                images = images[:, picks] if picks is not None else images[:, 0]
            images = images.movedim(-1, -3).float().clamp(0, 1)
        return images.clone()      # a plain tensor again, in [0, 1]

    @contextlib.contextmanager
    def lora_disabled(self):
        was = self.lora.enabled
        self.lora.enabled = False
        try:
            yield
        finally:
            self.lora.enabled = was

    def run(self, fn: Callable[[], Any], max_batch: int = 1) -> Any:
        """Call ``fn()`` inside ComfyUI's sampling context (models loaded, conds processed)."""
        import comfy.samplers

        policy, result = self, {}

        class _RunSampler(comfy.samplers.Sampler):
            def sample(self, model_wrap, sigmas, extra_args, callback, noise, latent_image=None,
                       denoise_mask=None, disable_pbar=False):
                make_trainable_tensors(model_wrap.inner_model)
                policy.guider.merged = {}  # conds were just processed for this phase: merge them afresh
                policy._wrap, policy._extra = model_wrap, extra_args
                try:
                    with copy_on_write_saved(policy.snapshot_activations and torch.is_grad_enabled()):
                        result["value"] = fn()
                finally:
                    policy._wrap, policy._extra = None, {}
                return noise

        grad = torch.is_grad_enabled()  # inference_mode(False) would switch grad on: keep the caller's mode
        with torch.inference_mode(False), torch.set_grad_enabled(grad):
            noise = torch.zeros((max(1, max_batch), *self._shape))
            self.guider.sample(noise, torch.zeros_like(noise), _RunSampler(), self.sigmas(2), seed=self.seed,
                               disable_pbar=True)
        return result["value"]


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(torch.equal(a, b)) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values: not the same
        return False


#: keys of a processed ComfyUI cond that its sampler reads at each model call (besides ``model_conds``)
CALL_TIME_KEYS = ("timestep_start", "timestep_end", "area", "strength", "mask", "mask_strength",
                  "set_area_to_bounds", "hooks", "control", "gligen")


def rows_conds(conds: dict, groups: list, kind: str):
    """One processed cond list whose tensors hold row ``r``'s prompt at row ``r`` (``groups``: contiguous row
    ranges ``(a, b, prompt)``), so a whole tree level is one model call; ``(None, True)`` when no prompt has this
    kind of cond (no negative), ``(None, False)`` when they cannot be merged (several cond entries, areas,
    masks, …: the caller then calls the model per prompt)."""
    from comfy.conds import CONDConstant, CONDCrossAttn, CONDRegular

    lists = [conds.get(f"{kind}_{i}") for _, _, i in groups]
    if all(c is None for c in lists):
        return None, True
    if any(c is None or len(c) != 1 for c in lists):
        return None, False
    first = lists[0][0]
    for c in lists[1:]:  # what ComfyUI reads from a cond at call time must agree (raw inputs are in model_conds)
        if any(not _same(c[0].get(k), first.get(k)) for k in CALL_TIME_KEYS):
            return None, False
    merged = {}
    for key, c0 in first["model_conds"].items():
        per = [c[0]["model_conds"].get(key) for c in lists]
        if any(type(c) is not type(c0) for c in per):
            return None, False
        if type(c0) is CONDConstant:
            if not all(c0.can_concat(c) for c in per):
                return None, False
            merged[key] = c0
            continue
        if type(c0) not in (CONDRegular, CONDCrossAttn) or any(c.cond.shape[0] != 1 for c in per):
            return None, False
        rows = [c for (a, b, _), c in zip(groups, per) for _ in range(b - a)]
        if not all(rows[0].can_concat(c) for c in per):
            return None, False
        merged[key] = type(c0)(rows[0].concat(rows[1:]))
    return [dict(first, model_conds=merged)], True


def _make_guider(patcher, conds):
    import comfy.samplers

    class TreeGuider(comfy.samplers.CFGGuider):
        """CFG guider holding one (positive, negative) pair per prompt; ``groups`` routes contiguous row ranges
        of a batch to their prompt's conds. The conds of all rows are merged into one batched model call (CFG
        included) when ComfyUI's conds allow it, else each prompt group gets its own call."""

        groups: list = []
        merged: dict = {}   # (row groups) -> merged (positive, negative) conds, for the conds of one phase

        def predict_noise(self, x, timestep, model_options={}, seed=None):
            groups = self.groups or [(0, x.shape[0], 0)]
            if len(groups) > 1:
                key = tuple(groups)
                if key not in self.merged:  # a tree level's rows repeat at every step: merge them once
                    self.merged[key] = (rows_conds(self.conds, groups, "positive"),
                                        rows_conds(self.conds, groups, "negative"))
                (pos, ok_p), (neg, ok_n) = self.merged[key]
                if pos is not None and ok_p and ok_n:
                    return comfy.samplers.sampling_function(self.inner_model, x, timestep, neg, pos, self.cfg,
                                                            model_options=model_options, seed=seed)
            outs = []
            for a, b, i in groups:
                outs.append(comfy.samplers.sampling_function(
                    self.inner_model, x[a:b], timestep[a:b], self.conds.get(f"negative_{i}"),
                    self.conds.get(f"positive_{i}"), self.cfg, model_options=model_options, seed=seed))
            return torch.cat(outs) if len(outs) > 1 else outs[0]

    g = TreeGuider(patcher)
    d = {}
    for i, (pos, neg) in enumerate(conds):
        d[f"positive_{i}"] = pos
        if neg is not None:
            d[f"negative_{i}"] = neg
    g.inner_set_conds(d)
    return g
