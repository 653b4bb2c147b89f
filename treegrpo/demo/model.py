"""The demo's tiny text-conditioned rectified-flow DiT (pixel space, 3×16×16).

Latent = image scaled to [-1, 1]. ``x_σ = (1 − σ)·x0 + σ·ε`` and the model predicts the velocity
``v = ε − x0``. The prompt enters as two learned word tokens (colour, shape; token 0 = null, used for the
empty / unconditional prompt) that join the 64 image patch tokens in every block's self-attention
(in-context / MMDiT-like joint attention with shared weights). The timestep conditions every block
through adaLN-Zero modulation. Attention projections are ``nn.Linear`` modules named ``to_q``, ``to_k``,
``to_v``, ``to_out`` (the LoRA targets).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch import nn

from .shapes import COLOURS, RESOLUTION, SHAPES, parse_prompt

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_FLOW_PATH = ASSETS / "demo_flow.safetensors"
FORMAT = "treegrpo-demo-flow"
REGENERATE_HINT = "regenerate it with: python -m treegrpo.demo.pretrain --out treegrpo/demo/assets"

NULL_TOKEN = 0
TEXT_LEN = 2


def vocabulary() -> list[str]:
    """Token id → word: ``["<null>", *COLOURS, *SHAPES]``."""
    return ["<null>", *COLOURS, *SHAPES]


def tokenize(prompts: list[str] | str) -> torch.Tensor:
    """(B, 2) long: ``[colour token, shape token]``; the empty prompt gives ``[null, null]``."""
    if isinstance(prompts, str):
        prompts = [prompts]
    out = torch.full((len(prompts), TEXT_LEN), NULL_TOKEN, dtype=torch.long)
    for i, p in enumerate(prompts):
        if p.strip() == "":
            continue
        c, s = parse_prompt(p)
        out[i, 0] = 1 + c
        out[i, 1] = 1 + len(COLOURS) + s
    return out


@dataclass
class DemoConfig:
    """Architecture of the demo flow model (stored as JSON in the safetensors metadata)."""

    resolution: int = RESOLUTION
    in_channels: int = 3
    patch_size: int = 2
    hidden: int = 64
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    vocab_size: int = 1 + len(COLOURS) + len(SHAPES)
    text_len: int = TEXT_LEN
    freq_dim: int = 64
    pooled_text: bool = True  # also add the mean word embedding to the adaLN conditioning (as SD3's pooled text)

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} must be divisible by heads {self.heads}")
        if self.resolution % self.patch_size:
            raise ValueError(f"resolution {self.resolution} must be divisible by patch_size {self.patch_size}")

    @property
    def num_patches(self) -> int:
        return (self.resolution // self.patch_size) ** 2

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DemoConfig":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown DemoConfig fields {sorted(unknown)}")
        return cls(**data)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_pos_embed_2d(dim: int, grid: int) -> torch.Tensor:
    """(1, grid*grid, dim) fixed 2-D sine-cosine position embedding (as in DiT / MAE)."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    pos = torch.arange(grid, dtype=torch.float64)
    yy, xx = torch.meshgrid(pos, pos, indexing="ij")
    parts = []
    for coord in (yy.reshape(-1), xx.reshape(-1)):
        ang = coord[:, None] * omega[None]
        parts += [torch.sin(ang), torch.cos(ang)]
    emb = torch.cat(parts, dim=1)
    emb = F.pad(emb, (0, dim - emb.shape[1]))
    return emb.float().unsqueeze(0)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads

        def split(t):
            return t.view(b, n, h, d // h).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x))
        # Plain softmax attention: on CPU at these sizes (66 tokens) it beats SDPA's kernels.
        att = torch.softmax((q * (d // h) ** -0.5) @ k.transpose(-1, -2), dim=-1)
        o = att @ v
        return self.to_out(o.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.adaLN_modulation = nn.Linear(dim, 6 * dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        sh1, sc1, g1, sh2, sc2, g2 = self.adaLN_modulation(c).chunk(6, dim=-1)
        x = x + g1.unsqueeze(1) * self.attn(_modulate(self.norm1(x), sh1, sc1))
        x = x + g2.unsqueeze(1) * self.mlp(_modulate(self.norm2(x), sh2, sc2))
        return x


class DemoDiT(nn.Module):
    """``forward(x (B,3,16,16), sigma (B,), tokens (B,2) long) -> v (B,3,16,16)``."""

    def __init__(self, config: DemoConfig | None = None):
        super().__init__()
        self.config = cfg = config or DemoConfig()
        d, p = cfg.hidden, cfg.patch_size
        self.patch_embed = nn.Linear(cfg.in_channels * p * p, d)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, d))
        self.token_embed = nn.Embedding(cfg.vocab_size, d)
        self.text_pos = nn.Parameter(torch.zeros(1, cfg.text_len, d))
        self.t_embed = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        if cfg.pooled_text:
            self.text_pool = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList([Block(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth)])
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.adaLN_out = nn.Linear(d, 2 * d)
        self.proj_out = nn.Linear(d, cfg.in_channels * p * p)
        self.gradient_checkpointing = False   # recompute each block in backward (less memory, more time)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        with torch.no_grad():  # learnable, initialised to the 2-D sin-cos embedding
            self.pos_embed.copy_(sincos_pos_embed_2d(self.config.hidden, self.config.resolution // self.config.patch_size))
        nn.init.normal_(self.text_pos, std=0.02)
        nn.init.normal_(self.token_embed.weight, std=0.5)
        nn.init.normal_(self.t_embed[0].weight, std=0.02)
        nn.init.normal_(self.t_embed[2].weight, std=0.02)
        for blk in self.blocks:  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(blk.adaLN_modulation.weight)
            nn.init.zeros_(blk.adaLN_modulation.bias)
        nn.init.zeros_(self.adaLN_out.weight)
        nn.init.zeros_(self.adaLN_out.bias)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        b, ch, hgt, wid = x.shape
        p = cfg.patch_size
        hp, wp = hgt // p, wid // p
        if (ch, hgt, wid) != (cfg.in_channels, cfg.resolution, cfg.resolution):
            r = cfg.resolution
            if ch != cfg.in_channels:
                raise ValueError(f"the demo model takes {cfg.in_channels}-channel latents (B, {cfg.in_channels}, {r}, "
                                 f"{r}), got {tuple(x.shape)}: encode its images with the demo model's own VAE")
            raise ValueError(f"the demo model makes {r}×{r} images, not {wid}×{hgt}: set width and height to {r} "
                             "(in ComfyUI: a conditioning area crops the latent it sees, and the demo model has no "
                             "area support)")
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).reshape(-1).expand(b)
        patches = x.view(b, ch, hp, p, wp, p).permute(0, 2, 4, 1, 3, 5).reshape(b, hp * wp, ch * p * p)
        img = self.patch_embed(patches) + self.pos_embed
        txt = self.token_embed(tokens.to(x.device)) + self.text_pos
        n_txt = txt.shape[1]
        h = torch.cat([txt, img], dim=1)
        c = self.t_embed(timestep_embedding(sigma * 1000.0, cfg.freq_dim))
        if cfg.pooled_text:
            c = c + self.text_pool(txt.mean(dim=1))
        c = F.silu(c)
        recompute = self.gradient_checkpointing and torch.is_grad_enabled()
        for blk in self.blocks:
            h = checkpoint(blk, h, c, use_reentrant=False) if recompute else blk(h, c)
        shift, scale = self.adaLN_out(c).chunk(2, dim=-1)
        out = self.proj_out(_modulate(self.norm_out(h[:, n_txt:]), shift, scale))
        return out.view(b, hp, wp, ch, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, hgt, wid)


def flow_sigmas(steps: int, shift: float = 1.0) -> torch.Tensor:
    """(steps + 1,) float32: ``linspace(1, 0)`` mapped through ``σ' = shift·σ / (1 + (shift − 1)·σ)``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return (shift * s / (1 + (shift - 1) * s)).float()


@torch.no_grad()
def euler_sample(
    model: nn.Module, noise: torch.Tensor, tokens: torch.Tensor, steps: int = 10, cfg: float = 1.0, shift: float = 1.0
) -> torch.Tensor:
    """Euler ODE sampling from ``x = noise`` at σ = 1: ``x ← x + (σ' − σ)·v``; returns x at σ = 0 (in [-1, 1]).

    With ``cfg != 1`` cond and uncond (null tokens) run as one batched forward.
    """
    sigmas = flow_sigmas(steps, shift).to(noise.device)
    x = noise.float()
    b = x.shape[0]
    tokens = tokens.to(noise.device)
    null = torch.full_like(tokens, NULL_TOKEN)
    for i in range(steps):
        sigma = sigmas[i].expand(b)
        if cfg == 1.0:
            v = model(x, sigma, tokens)
        else:
            v_c, v_u = model(torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([tokens, null])).chunk(2)
            v = v_u + cfg * (v_c - v_u)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    return x


def save_demo_model(model: DemoDiT, path: str | os.PathLike, extra_metadata: dict[str, str] | None = None) -> None:
    """Write ``model`` as float32 safetensors with its config in the metadata (atomic)."""
    meta = {"format": FORMAT, "config": model.config.to_json(), "vocabulary": json.dumps(vocabulary())}
    save_weights(model, path, {**meta, **(extra_metadata or {})})


def save_weights(module: nn.Module, path: str | os.PathLike, metadata: dict[str, str]) -> None:
    """``module``'s state as float32 safetensors with ``metadata``, written atomically (temp, fsync, rename)."""
    from safetensors.torch import save_file

    from ..io import atomic_write

    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in module.state_dict().items()}
    atomic_write(str(path), lambda tmp: save_file(state, tmp, metadata=metadata))


def read_safetensors(path: str | os.PathLike, what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file, with a clear error if it is missing or unreadable."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} weights not found at {str(path)!r}; {REGENERATE_HINT}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"{what} weights at {str(path)!r} are not a readable safetensors file ({e}); {REGENERATE_HINT}") from e
    return tensors, meta


def check_state_dict(module: nn.Module, state: dict[str, torch.Tensor], what: str, path) -> None:
    """Raise ValueError listing missing, unexpected and mis-shaped keys."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {expected[k]}"
        for k in sorted(set(expected) & set(state))
        if tuple(state[k].shape) != expected[k]
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:8]}{' …' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:8]}{' …' if len(unexpected) > 8 else ''}")
        if shapes:
            parts.append(f"shape mismatches {shapes[:8]}{' …' if len(shapes) > 8 else ''}")
        raise ValueError(f"{what} weights at {str(path)!r} do not match the architecture: {'; '.join(parts)}")


def load_demo_model(path: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> DemoDiT:
    """Load the demo flow model (default: the shipped ``assets/demo_flow.safetensors``), in eval mode."""
    path = Path(path) if path is not None else DEFAULT_FLOW_PATH
    state, meta = read_safetensors(path, "demo flow model")
    if meta.get("format") != FORMAT or "config" not in meta:
        raise ValueError(
            f"{str(path)!r} is not a demo flow model file (metadata format={meta.get('format')!r}, "
            f"expected {FORMAT!r} with a 'config' entry); {REGENERATE_HINT}"
        )
    config = DemoConfig.from_json(meta["config"])
    if "vocabulary" in meta and json.loads(meta["vocabulary"]) != vocabulary():
        raise ValueError(
            f"demo flow model at {str(path)!r} was trained on vocabulary {json.loads(meta['vocabulary'])}, "
            f"but this code has {vocabulary()}; {REGENERATE_HINT}"
        )
    model = DemoDiT(config)
    check_state_dict(model, state, "demo flow model", path)
    model.load_state_dict(state)
    return model.to(device).eval().requires_grad_(False)
