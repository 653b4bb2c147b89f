"""Policy adapter for diffusers pipelines: SD1.x/SD2.x and SDXL (epsilon / v-prediction, DDIM-η SDE steps
in sigma space), SD3/SD3.5 and Flux (rectified flow with the model's shift).

Loading (offline, local files only): a diffusers folder (``model_index.json``), or a single-file
checkpoint with ``pipeline.config`` pointing at a local diffusers folder that supplies the configs and the
components the file lacks. Text encoders and VAE are frozen; LoRA (PEFT) goes on the UNet/transformer,
which is ``policy.model``.

Conventions (``treegrpo.policy``): latents are the VAE's raw latents (C, H, W) — packed for Flux
only inside :meth:`denoise`. Epsilon models work in k-diffusion sigma space ``x = x0 + σ·ε`` with
``σ_t = √((1 − ᾱ_t)/ᾱ_t)``; the UNet sees ``x/√(σ²+1)`` at the (fractional) timestep of ``σ``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..config import PipelineConfig
from ..lora import LoraWeights, peft_adapters_disabled, save_diffusers_lora_file
from ..memory import module_bytes
from ..policy import Policy, Prediction

# family -> (pipeline class, denoiser attribute, ComfyUI LoRA key prefix)
FAMILIES = {
    "sd": ("StableDiffusionPipeline", "unet", "lora_unet_"),
    "sdxl": ("StableDiffusionXLPipeline", "unet", "lora_unet_"),
    "sd3": ("StableDiffusion3Pipeline", "transformer", "lora_transformer_"),
    "flux": ("FluxPipeline", "transformer", "lora_transformer_"),
}
_CLASS_FAMILY = {v[0]: k for k, v in FAMILIES.items()}
# keys that mark a full single-file checkpoint (denoiser + VAE + text encoders) rather than a bare denoiser
_FULL_CHECKPOINT_MARKERS = ("first_stage_model.", "cond_stage_model.", "conditioner.", "text_encoders.")


class ModelLoadError(ValueError):
    """The model path cannot be loaded (missing files, unknown family, missing configs)."""


def detect_family(path: str, config_dir: Optional[str] = None) -> str:
    """Family from ``model_index.json``'s ``_class_name`` of the folder (or of ``config_dir``)."""
    folder = path if os.path.isdir(path) else config_dir
    index = os.path.join(folder or "", "model_index.json")
    if not folder or not os.path.isfile(index):
        raise ModelLoadError(f"cannot tell the model family of {path!r}: no model_index.json"
                             + ("" if os.path.isdir(path) else " (single file: set pipeline.config to a local "
                                "diffusers folder)") + "; or set pipeline.family to one of " + ", ".join(FAMILIES))
    name = json.load(open(index, encoding="utf-8")).get("_class_name", "")
    if name in _CLASS_FAMILY:
        return _CLASS_FAMILY[name]
    raise ModelLoadError(f"{index} names pipeline {name!r}; supported: {sorted(_CLASS_FAMILY)}")


def model_family(path: str, pcfg) -> str:
    """The family to load ``path`` as: ``pipeline.family``, or ``auto`` read from ``model_index.json``. A family
    set against what the folder's ``model_index.json`` names (one this backend knows) is refused before anything
    loads (the wrong pipeline class failed minutes later, inside the first prompt's encoding)."""
    if pcfg.family == "auto":
        return detect_family(path, pcfg.config)
    try:
        found = detect_family(path, pcfg.config)
    except (ModelLoadError, OSError, ValueError):
        return pcfg.family          # no index (a single file), or one naming a class this backend does not know
    if found != pcfg.family:
        raise ModelLoadError(f"pipeline.family is {pcfg.family!r}, but the model_index.json of {path!r} names a "
                             f"{found!r} pipeline: leave pipeline.family at 'auto' (it reads the folder), or give a "
                             f"{pcfg.family} model")
    return found


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _single_file_is_full(path: str) -> bool:
    from safetensors import safe_open
    if not path.endswith(".safetensors"):
        return True  # .ckpt/.pt: only full checkpoints are published in that form
    with safe_open(path, framework="pt") as f:
        return any(k.startswith(_FULL_CHECKPOINT_MARKERS) for k in f.keys())


def load_pipeline(path: str, pcfg: PipelineConfig, device: torch.device):
    """(pipeline, family) from a local diffusers folder or single-file checkpoint; nothing is downloaded."""
    import diffusers

    if not os.path.exists(path):
        raise ModelLoadError(f"model path {path!r} does not exist: give a local diffusers folder (with "
                             "model_index.json) or a .safetensors checkpoint")
    if pcfg.config and not os.path.isdir(pcfg.config):
        raise ModelLoadError(f"PipelineConfig.config: {pcfg.config!r} is not a folder")
    family = model_family(path, pcfg)
    cls_name, attr, _ = FAMILIES[family]
    cls = getattr(diffusers, cls_name)
    dtype = _dtype(pcfg.dtype, device)
    try:
        if os.path.isdir(path):
            pipe = cls.from_pretrained(path, dtype=dtype, local_files_only=True)
        else:
            if not pcfg.config:
                raise ModelLoadError(f"{path} is a single file: set pipeline.config to a local diffusers folder of "
                                     f"the same model ({cls_name}) for its configs, tokenizers and the parts the "
                                     "file lacks (nothing is downloaded)")
            if _single_file_is_full(path):
                pipe = cls.from_single_file(path, config=pcfg.config, torch_dtype=dtype, local_files_only=True)
            else:  # a bare UNet/transformer file (how Flux and many fine-tunes are published)
                den_cls = getattr(diffusers, "UNet2DConditionModel" if attr == "unet" else
                                  ("FluxTransformer2DModel" if family == "flux" else "SD3Transformer2DModel"))
                den = den_cls.from_single_file(path, config=pcfg.config, subfolder=attr, dtype=dtype,
                                               local_files_only=True)
                pipe = cls.from_pretrained(pcfg.config, dtype=dtype, local_files_only=True, **{attr: den})
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelLoadError(f"could not load {path!r} as {cls_name}: {e}") from e
    return pipe, family


def image_size(family: str, sample_size, vae_scale: int, pcfg: PipelineConfig) -> tuple[int, int]:
    """(height, width) in pixels: the config's, else the denoiser's ``sample_size`` (in latents) times the VAE's
    scale (Flux: 1024); ModelLoadError where they are not multiples of what the family needs."""
    default = int(sample_size) * vae_scale if isinstance(sample_size, int) and family != "flux" else \
        (1024 if family == "flux" else 512)
    h, w = pcfg.height or default, pcfg.width or default
    mult = vae_scale * (2 if family in ("sd3", "flux") else 1)
    if h % mult or w % mult:
        raise ModelLoadError(f"PipelineConfig.height/width: {h}x{w} must be multiples of {mult} for {family}")
    return h, w


def latent_shape_from_files(path: str, pcfg: PipelineConfig) -> Optional[tuple[int, int, int]]:
    """A leaf's latent shape (C, h, w) from the folder's JSON configs alone (``vae/config.json`` and the denoiser's),
    before any weight is read; None where the folder does not say (a single-file checkpoint without
    ``pipeline.config``)."""
    folder = path if os.path.isdir(path) else pcfg.config
    if not folder or not os.path.isdir(folder):
        return None
    family = model_family(path, pcfg)
    _, attr, _ = FAMILIES[family]

    def read(sub):
        f = os.path.join(folder, sub, "config.json")
        return json.load(open(f, encoding="utf-8")) if os.path.isfile(f) else None

    vae, den = read("vae"), read(attr)
    if vae is None or den is None or "latent_channels" not in vae or "block_out_channels" not in vae:
        return None
    scale = 2 ** (len(vae["block_out_channels"]) - 1)
    h, w = image_size(family, den.get("sample_size"), scale, pcfg)
    return int(vae["latent_channels"]), h // scale, w // scale


class DiffusersPolicy(Policy):
    """A diffusers pipeline behind the ``Policy`` protocol (see module docstring)."""

    def __init__(self, pipe, family: str, pcfg: Optional[PipelineConfig] = None,
                 device: str | torch.device = "cpu", guidance_hint: float = 1.0):
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; use one of {list(FAMILIES)}")
        self.pipe, self.family = pipe, family
        self.pcfg = pcfg or PipelineConfig()
        self.device = torch.device(device)
        self.guidance_hint = guidance_hint  # > 1: encode the negative prompt too
        self.t5_tokens = self.pcfg.max_sequence_length or (512 if family == "flux" else 256)
        _, attr, self.comfy_prefix = FAMILIES[family]
        self.model: nn.Module = getattr(pipe, attr)
        pipe.to(self.device)
        for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
            m = getattr(pipe, name, None)
            if m is not None:
                m.requires_grad_(False).eval()
        self.model.requires_grad_(False).eval()
        self.dtype = next(self.model.parameters()).dtype
        self.vae_scale = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
        self.height, self.width = self._image_size()
        sched_cfg = dict(pipe.scheduler.config)
        if family in ("sd", "sdxl"):
            self.prediction: Prediction = "epsilon"
            pt = sched_cfg.get("prediction_type", "epsilon")
            if pt not in ("epsilon", "v_prediction"):
                raise ModelLoadError(f"scheduler prediction_type {pt!r} is not supported (epsilon, v_prediction)")
            self.v_prediction = pt == "v_prediction"
            from diffusers import DDIMScheduler
            self.scheduler = DDIMScheduler.from_config(sched_cfg)
            ac = self.scheduler.alphas_cumprod.double()
            self._log_sigmas = (((1 - ac) / ac).sqrt()).log().float().numpy()
        else:
            self.prediction = "flow"
            self.v_prediction = False
            from diffusers import FlowMatchEulerDiscreteScheduler
            if self.pcfg.shift > 0:
                sched_cfg.update(shift=self.pcfg.shift, use_dynamic_shifting=False)
            self.scheduler = FlowMatchEulerDiscreteScheduler.from_config(sched_cfg)

    @property
    def decode_batch(self) -> int:
        return self.pcfg.decode_batch

    @decode_batch.setter
    def decode_batch(self, n: int) -> None:   # the memory plan's choice
        self.pcfg = dataclasses.replace(self.pcfg, decode_batch=int(n))

    def set_tiled_decode(self, on: bool) -> bool:
        vae = self.pipe.vae
        if not hasattr(vae, "enable_tiling"):
            return False
        (vae.enable_tiling if on else vae.disable_tiling)()
        return True

    def set_gradient_checkpointing(self, on: bool) -> bool:
        if not getattr(self.model, "_supports_gradient_checkpointing", False):
            return False
        (self.model.enable_gradient_checkpointing if on else self.model.disable_gradient_checkpointing)()
        return True

    def memory_weights(self) -> dict[str, int]:
        out = {"denoiser": module_bytes(self.model), "vae": module_bytes(self.pipe.vae)}
        enc = [getattr(self.pipe, n, None) for n in ("text_encoder", "text_encoder_2", "text_encoder_3")]
        out["text_encoders"] = sum(module_bytes(m) for m in enc if m is not None and
                                   next(m.parameters()).device.type == self.device.type)
        return out

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: str, pcfg: Optional[PipelineConfig] = None, device: str | torch.device = "cpu",
             guidance_hint: float = 1.0) -> "DiffusersPolicy":
        pcfg = pcfg or PipelineConfig()
        dev = torch.device(device)
        pipe, family = load_pipeline(path, pcfg, dev)
        return cls(pipe, family, pcfg, dev, guidance_hint)

    def _image_size(self) -> tuple[int, int]:
        return image_size(self.family, getattr(self.model.config, "sample_size", None), self.vae_scale, self.pcfg)

    # ------------------------------------------------------------------ Policy protocol
    def latent_shape(self) -> tuple[int, int, int]:
        c = self.pipe.vae.config.latent_channels
        return (int(c), self.height // self.vae_scale, self.width // self.vae_scale)

    def sigmas(self, steps: int) -> torch.Tensor:
        if self.prediction == "epsilon":
            self.scheduler.set_timesteps(steps)
            ts = self.scheduler.timesteps.long()
            ac = self.scheduler.alphas_cumprod.double()[ts]
            sig = ((1 - ac) / ac).sqrt().float()
            return torch.cat([sig, sig.new_zeros(1)])
        if self.family == "flux":
            from diffusers.pipelines.flux.pipeline_flux import calculate_shift
            c = self.scheduler.config
            seq = (self.latent_shape()[1] // 2) * (self.latent_shape()[2] // 2)
            mu = calculate_shift(seq, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                                 c.get("base_shift", 0.5), c.get("max_shift", 1.15))
            kw = {"mu": mu} if c.get("use_dynamic_shifting", False) else {}
            self.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / steps, steps), **kw)
        else:
            self.scheduler.set_timesteps(steps)
        return self.scheduler.sigmas.float().clone()

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], negative: str = "") -> dict:
        """``{"cond": {...}, "uncond": {...}}`` (uncond only when CFG is used); tensors lead with the prompt."""
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        neg = [negative] * len(prompts)
        p, dev, cfg_on = self.pipe, self.device, self.guidance_hint > 1
        if self.family == "sd":
            pe, ne = p.encode_prompt(prompts, dev, 1, cfg_on, negative_prompt=neg if cfg_on else None)
            out = {"cond": {"embeds": pe}}
            if cfg_on:
                out["uncond"] = {"embeds": ne}
            return out
        if self.family == "sdxl":
            pe, ne, pp, npool = p.encode_prompt(prompt=prompts, device=dev, num_images_per_prompt=1,
                                                do_classifier_free_guidance=cfg_on,
                                                negative_prompt=neg if cfg_on else None)
            ids = torch.tensor([self.height, self.width, 0, 0, self.height, self.width], device=dev,
                               dtype=pe.dtype).expand(len(prompts), -1).contiguous()
            out = {"cond": {"embeds": pe, "pooled": pp, "time_ids": ids}}
            if cfg_on:
                out["uncond"] = {"embeds": ne, "pooled": npool, "time_ids": ids}
            return out
        if self.family == "sd3":
            pe, ne, pp, npool = p.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None, device=dev,
                                                do_classifier_free_guidance=cfg_on,
                                                negative_prompt=neg if cfg_on else None,
                                                max_sequence_length=self.t5_tokens)
            out = {"cond": {"embeds": pe, "pooled": pp}}
            if cfg_on:
                out["uncond"] = {"embeds": ne, "pooled": npool}
            return out
        pe, pp, _ = p.encode_prompt(prompt=prompts, prompt_2=None, device=dev,
                                    max_sequence_length=self.t5_tokens)
        out = {"cond": {"embeds": pe, "pooled": pp}}
        if cfg_on:
            ne, npool, _ = p.encode_prompt(prompt=neg, prompt_2=None, device=dev,
                                           max_sequence_length=self.t5_tokens)
            out["uncond"] = {"embeds": ne, "pooled": npool}
        return out

    def sigma_to_t(self, sigma: torch.Tensor) -> torch.Tensor:
        """Epsilon models: the fractional training timestep of ``σ`` (log-σ interpolation)."""
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(sigma):     # the memory plan's probe measures shapes: there is no σ to look up
            return torch.zeros(sigma.shape, dtype=torch.float32, device=sigma.device)
        ls = np.log(sigma.detach().float().clamp_min(1e-10).cpu().numpy())
        return torch.as_tensor(np.interp(ls, self._log_sigmas, np.arange(len(self._log_sigmas))),
                               dtype=torch.float32, device=sigma.device)

    def _autocast(self):
        if self.device.type == "cuda" and self.pcfg.autocast:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _x0(self, x: torch.Tensor, sigma: torch.Tensor, c: dict) -> torch.Tensor:
        """x̂0 (float32) for latents ``x`` (B, C, H, W) at ``sigma`` (B,) under conditioning ``c``."""
        b = x.shape[0]
        s4 = sigma.view(b, 1, 1, 1)
        dt = self.dtype
        with self._autocast():
            if self.prediction == "epsilon":
                c_in = 1 / (s4 ** 2 + 1).sqrt()
                kw = {}
                if self.family == "sdxl":
                    kw["added_cond_kwargs"] = {"text_embeds": c["pooled"].to(dt), "time_ids": c["time_ids"].to(dt)}
                out = self.model((x * c_in).to(dt), self.sigma_to_t(sigma), encoder_hidden_states=c["embeds"].to(dt),
                                 return_dict=False, **kw)[0].float()
                if self.v_prediction:
                    return x * c_in ** 2 - s4 * c_in * out
                return x - s4 * out
            if self.family == "sd3":
                v = self.model(hidden_states=x.to(dt), timestep=sigma.to(dt) * 1000,
                               encoder_hidden_states=c["embeds"].to(dt), pooled_projections=c["pooled"].to(dt),
                               return_dict=False)[0].float()
                return x - s4 * v
            # flux: pack 2x2 patches into tokens, run, unpack
            ch, h, w = x.shape[1:]
            packed = self.pipe._pack_latents(x.to(dt), b, ch, h, w)
            img_ids = self.pipe._prepare_latent_image_ids(b, h // 2, w // 2, x.device, dt)
            txt_ids = torch.zeros(c["embeds"].shape[1], 3, device=x.device, dtype=dt)
            guidance = (torch.full((b,), self.pcfg.guidance_embed, device=x.device, dtype=torch.float32)
                        if getattr(self.model.config, "guidance_embeds", False) else None)
            v = self.model(hidden_states=packed, timestep=sigma.to(dt), guidance=guidance,
                           pooled_projections=c["pooled"].to(dt), encoder_hidden_states=c["embeds"].to(dt),
                           txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
            v = self.pipe._unpack_latents(v, h * self.vae_scale, w * self.vae_scale, self.vae_scale).float()
            return x - s4 * v

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, cond: Any, cfg: float) -> torch.Tensor:
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).reshape(-1).expand(b)
        x = x.float()
        if cfg == 1.0:
            return self._x0(x, sigma, cond["cond"])
        if "uncond" not in cond:
            raise ValueError("cfg != 1 but the prompts were encoded without a negative: build the policy with "
                             "guidance_hint = cfg (the CLI does)")
        both = {k: torch.cat([cond["cond"][k], cond["uncond"][k]]) for k in cond["cond"]}
        x0_c, x0_u = self._x0(torch.cat([x, x]), torch.cat([sigma, sigma]), both).chunk(2)
        return x0_u + cfg * (x0_c - x0_u)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        sf = vae.config.scaling_factor
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        out = []
        for z in latents.split(self.pcfg.decode_batch):
            z = z.to(self.device, vae.dtype) / sf + shift
            out.append(((vae.decode(z, return_dict=False)[0].float() + 1) / 2).clamp(0, 1))
        return torch.cat(out)

    def lora_disabled(self) -> contextlib.AbstractContextManager:
        return peft_adapters_disabled(self.model)

    # ------------------------------------------------------------------ LoRA files
    def comfy_lora_state_dict(self, w: LoraWeights) -> dict:
        """ComfyUI keys (``lora_unet_<module_path>`` / ``lora_transformer_<module_path>`` with ``_`` for ``.``,
        ``lora_down``/``lora_up``/``alpha``), which ComfyUI's LoraLoader maps onto its own modules."""
        from ..lora import to_comfy
        return to_comfy(w, prefix=self.comfy_prefix, name_map={n: n.replace(".", "_") for n in w.modules})

    def save_diffusers_lora(self, w: LoraWeights, path: str, metadata: Optional[dict] = None) -> str:
        """Write the LoRA with ``pipe.save_lora_weights`` (:func:`treegrpo.lora.save_diffusers_lora_file`)."""
        return save_diffusers_lora_file(w, path, type(self.pipe), FAMILIES[self.family][1])
