"""How far a LoRA moved the demo model toward the scripted artist's taste (big shapes): the measure the artist
browser test and the taste server test state their margins in."""
from __future__ import annotations

from pathlib import Path


def samples_area(lora: Path | None, n: int = 64, seed: int = 123) -> float:
    """Mean shape area of n ODE samples of 'a red circle' from the demo model (with ``lora`` put in)."""
    import torch

    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.demo.shapes import shape_area
    from treegrpo.tree import sample_ode

    cfg = TrainConfig.from_dict(cli.demo_config_dict())
    policy, base = load_policy(cfg)
    if lora is not None:
        cli.apply_lora_file(policy, base, cfg, cli.read_checked_lora(str(lora)), str(lora))
    noise = torch.randn((n, *policy.latent_shape()), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        imgs = policy.decode(sample_ode(policy, ["a red circle"] * n, noise, cfg.tree.steps, cfg.guidance_scale))
    return float(shape_area(imgs).mean())
