"""Test-only ComfyUI node pack: tiny random models of ComfyUI's real architectures (SD1.x and SDXL UNets, SD3
MMDiT, Flux, Chroma, Qwen-Image, HunyuanVideo), built in memory with ComfyUI's own classes, plus a latent→image projection so rewards can score
them. Loaded next to the real pack by tests/comfyui/test_comfy_nodes.py; never shipped to users."""
import torch

from .compat import newer_fields


def _tiny(arch: str, seed: int):
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm

    torch.manual_seed(seed)
    if arch == "sd15":
        unet = {"use_checkpoint": False, "image_size": 8, "out_channels": 4, "use_spatial_transformer": True,
                "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 32,
                "num_res_blocks": [1, 1], "transformer_depth": [1, 1], "channel_mult": [1, 2],
                "transformer_depth_middle": 1, "use_linear_in_transformer": False, "context_dim": 32,
                "transformer_depth_output": [1, 1, 1, 1], "use_temporal_attention": False,
                "use_temporal_resblock": False}
        cfg = sm.SD15(newer_fields(unet))
        cfg.unet_config["num_heads"], cfg.unet_config["num_head_channels"] = 2, -1
        ctx = (1, 8, 32)
        pooled = None
    elif arch == "sdxl":   # SDXL's UNet: linear transformers, pooled text + size embeddings through adm (2816)
        unet = {"use_checkpoint": False, "image_size": 8, "out_channels": 4, "use_spatial_transformer": True,
                "legacy": False, "adm_in_channels": 2816, "num_classes": "sequential", "in_channels": 4,
                "model_channels": 32, "num_res_blocks": [1, 1], "transformer_depth": [0, 1], "channel_mult": [1, 2],
                "transformer_depth_middle": 1, "use_linear_in_transformer": True, "context_dim": 32,
                "transformer_depth_output": [0, 0, 1, 1], "use_temporal_attention": False,
                "use_temporal_resblock": False, "num_head_channels": 16}
        cfg = sm.SDXL(newer_fields(unet))
        ctx = (1, 8, 32)
        pooled = (1, 1280)
    elif arch == "sd3":
        unet = {"in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": 1, "adm_in_channels": 32,
                "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 32, "out_features": 64}},
                "num_patches": 64, "pos_embed_max_size": 8, "pos_embed_scaling_factor": None, "input_size": None}
        cfg = sm.SD3(newer_fields(unet))
        ctx = (1, 8, 32)
        pooled = (1, 32)
    elif arch == "flux":
        unet = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16,
                "vec_in_dim": 32, "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2,
                "depth": 1, "depth_single_blocks": 1, "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2,
                "qkv_bias": True}
        cfg = sm.Flux(newer_fields(unet))
        ctx = (1, 8, 32)
        pooled = (1, 32)
    elif arch == "chroma":   # Flux-like blocks with in-place residual adds; guidance and modulation from an approximator
        unet = {"image_model": "chroma", "in_channels": 64, "out_channels": 64, "context_in_dim": 32,
                "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 1, "depth_single_blocks": 1,
                "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2, "qkv_bias": True, "in_dim": 64,
                "out_dim": 64, "hidden_dim": 32, "n_layers": 1}
        cfg = sm.Chroma(newer_fields(unet))
        ctx = (1, 8, 32)
        pooled = None
    elif arch == "qwen_image":   # 5-D latents (B, 16, 1, H, W); residuals added in place
        unet = {"image_model": "qwen_image", "patch_size": 2, "in_channels": 64, "out_channels": 16,
                "num_layers": 1, "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 32,
                "axes_dims_rope": (8, 12, 12)}
        cfg = sm.QwenImage(newer_fields(unet))
        ctx = (1, 8, 32)
        pooled = None
    elif arch == "hunyuan_video":   # video latents (B, 16, T, H, W); Flux-like blocks with in-place residuals
        unet = {"image_model": "hunyuan_video", "in_channels": 16, "out_channels": 16, "vec_in_dim": 32,
                "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 1,
                "depth_single_blocks": 1, "axes_dim": [8, 12, 12], "theta": 256, "patch_size": [1, 2, 2],
                "qkv_bias": True, "guidance_embed": True, "byt5": False, "meanflow": False,
                "use_cond_type_embedding": False, "vision_in_dim": None}
        cfg = sm.HunyuanVideo(newer_fields(unet))
        ctx = (1, 8, 32)
        pooled = (1, 32)
    else:
        raise ValueError(arch)
    model = cfg.get_model({})
    with torch.no_grad():
        # random, non-degenerate weights; ComfyUI allocates with torch.empty (weights come from a file), so
        # every parameter AND floating buffer (e.g. MMDiT's pos_embed) must be filled
        for t in [*model.diffusion_model.parameters(), *model.diffusion_model.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randn_like(t) * 0.05)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    g = torch.Generator().manual_seed(seed + 1)

    def cond():
        extra = {"pooled_output": torch.randn(pooled, generator=g)} if pooled else {}
        if arch == "chroma":
            extra = {"pooled_output": None, "guidance": 3.5}
        if arch == "hunyuan_video":
            extra["guidance"] = 6.0
        return [[torch.randn(ctx, generator=g), extra]]

    return patcher, cond(), cond()


class TinyModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"arch": (["sd15", "sd3", "flux"],), "seed": ("INT", {"default": 0, "min": 0, "max": 1000})}}

    RETURN_TYPES = ("MODEL", "CONDITIONING", "CONDITIONING")
    FUNCTION = "build"
    CATEGORY = "testing"

    def build(self, arch, seed):
        return _tiny(arch, seed)


class LatentToImage:
    """(B, C, H, W) latent → (B, H, W, 3) image in [0, 1]: sigmoid of the first three channels."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "convert"
    CATEGORY = "testing"

    def convert(self, samples):
        x = samples["samples"][:, :3].float()
        return (torch.sigmoid(x).movedim(1, -1),)


NODE_CLASS_MAPPINGS = {"TreeGRPOTestTinyModel": TinyModel, "TreeGRPOTestLatentToImage": LatentToImage}
