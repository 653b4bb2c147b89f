"""The Train node's presets: the tails they set and what they cost, on long and short schedules."""
import pytest
import torch

from treegrpo.config import TreeConfig
from treegrpo.presets import PRESETS, apply_preset, preset_cost
from treegrpo.tree import tail_sigmas


def test_the_presets_at_twenty_steps():
    base = TreeConfig(steps=20, window_start=1, window_width=3, branch=2)
    got = {p: (apply_preset(base, p).tail_solver, apply_preset(base, p).tail_steps) for p in PRESETS}
    assert got == {"fast": ("dpmpp_2m", 2), "balanced": ("dpmpp_2m", 6), "paper": ("euler", 0)}
    # per tree: 1 + 1 + 2 + 4 window calls (the shared prefix step and each level's parents), then 8 leaves' tails
    assert [preset_cost(apply_preset(base, p))[0] for p in ("fast", "balanced", "paper")] == [24, 56, 136]
    assert apply_preset(base, "custom") is base
    with pytest.raises(ValueError, match="preset: 'turbo' is not one of"):
        apply_preset(base, "turbo")


def test_a_preset_never_makes_the_tail_longer_than_the_schedules_own():
    """Z-Image's workflow samples 8 steps with the window at steps 1-3: 4 steps are left, and ``balanced``'s 6-step
    tail would cost more than ``paper``'s full one (56 against 40 calls a tree). Where a preset's steps reach what
    the schedule leaves, the tail is the schedule's own remaining steps."""
    z = TreeConfig(steps=8, window_start=1, window_width=3, branch=2)
    balanced, paper, fast = (apply_preset(z, p) for p in ("balanced", "paper", "fast"))
    assert (balanced.tail_solver, balanced.tail_steps) == ("dpmpp_2m", 0)
    assert preset_cost(balanced) == preset_cost(paper) == (40, 7)
    assert (fast.tail_steps, preset_cost(fast)[0]) == (2, 24)
    sigmas = torch.linspace(1, 0, 9)
    assert torch.equal(tail_sigmas(sigmas, 4, balanced.tail_steps), sigmas[4:])
    for steps in range(4, 31):
        for start in range(0, steps - 2):
            cfg = TreeConfig(steps=steps, window_start=start, window_width=2, branch=2)
            calls = {p: preset_cost(apply_preset(cfg, p))[0] for p in PRESETS}
            assert calls["fast"] <= calls["balanced"] <= calls["paper"], (steps, start, calls)
