"""The embedded demo task: generator, flow model, classifier, DemoPolicy and the adherence reward."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from treegrpo.policy import Policy
from treegrpo.backends.demo import DemoPolicy
from treegrpo.demo import pretrain
from treegrpo.demo.classifier import DEFAULT_CLASSIFIER_PATH, load_classifier
from treegrpo.demo.model import (
    DEFAULT_FLOW_PATH,
    DemoConfig,
    DemoDiT,
    euler_sample,
    load_demo_model,
    save_demo_model,
    tokenize,
)
from treegrpo.demo.shapes import (COLOURS, RESOLUTION, SHAPES, all_prompts, parse_prompt, render, sample_batch,
                                  shape_area)
from treegrpo.rewards.base import available, load_reward
from treegrpo.rewards.demo_adherence import DemoAdherence


@pytest.fixture(scope="module")
def policy() -> DemoPolicy:
    return DemoPolicy()


@pytest.fixture(scope="module")
def reward() -> DemoAdherence:
    return DemoAdherence()


# ---------------------------------------------------------------- generator


def test_render_is_deterministic_and_in_range():
    c = torch.arange(24) // len(SHAPES)
    s = torch.arange(24) % len(SHAPES)
    a = render(c, s, torch.Generator().manual_seed(3))
    b = render(c, s, torch.Generator().manual_seed(3))
    other = render(c, s, torch.Generator().manual_seed(4))
    assert a.shape == (24, 3, RESOLUTION, RESOLUTION) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.equal(a, other)
    assert a.min() >= 0 and a.max() <= 1
    # anti-aliased: edge pixels take intermediate values
    assert ((a > 0.25) & (a < 0.85)).any()
    one = render(0, 1, torch.Generator().manual_seed(0))
    assert one.shape == (1, 3, RESOLUTION, RESOLUTION)
    imgs, ci, si = sample_batch(8, torch.Generator().manual_seed(0))
    assert imgs.shape[0] == ci.shape[0] == si.shape[0] == 8


def test_shape_area_counts_the_pixels_away_from_the_background():
    """The scripted artist's measure on hand-made images: grey is 0, a 4x4 block of red is 16/256, a pixel 0.1 off
    grey is background, 0.2 off (in one channel, either sign) is shape, and an all-colour image is 1."""
    img = torch.full((4, 3, 16, 16), 0.2)
    img[1, :, 2:6, 3:7] = torch.tensor([0.9, 0.1, 0.1]).view(3, 1, 1)
    img[2, 0, 0, 0] = 0.3
    img[2, 2, 5, 5] = 0.0
    img[3] = torch.tensor([0.9, 0.1, 0.1]).view(3, 1, 1)
    assert shape_area(img).tolist() == [0.0, 16 / 256, 1 / 256, 1.0]
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        shape_area(img[:, 0])


def test_parse_prompt_round_trip_and_errors():
    prompts = all_prompts()
    assert len(prompts) == len(COLOURS) * len(SHAPES) == len(set(prompts))
    for i, p in enumerate(prompts):
        assert parse_prompt(p) == (i // len(SHAPES), i % len(SHAPES))
    assert parse_prompt("Red Circle.") == (COLOURS.index("red"), SHAPES.index("circle"))
    with pytest.raises(ValueError, match="purple") as e:
        parse_prompt("a purple circle")
    assert "red" in str(e.value) and "circle" in str(e.value)
    with pytest.raises(ValueError, match="hexagon"):
        parse_prompt("a red hexagon")
    with pytest.raises(ValueError, match="form"):
        parse_prompt("a big red circle")
    with pytest.raises(ValueError):
        render(len(COLOURS), 0)


# ---------------------------------------------------------------- classifier


def test_shipped_classifier_is_accurate():
    clf = load_classifier()
    acc = pretrain.classifier_accuracy(clf, n=1024, seed=2024)
    assert acc["joint"] >= 0.95, acc
    acc_aug = pretrain.classifier_accuracy(clf, n=1024, seed=2025, augmented=True)
    assert acc_aug["joint"] >= 0.9, acc_aug


def test_classifier_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="pretrain"):
        load_classifier(tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="not a demo classifier"):
        load_classifier(DEFAULT_FLOW_PATH)


# ---------------------------------------------------------------- flow model


def test_model_forward_shapes_and_lora_targets():
    torch.manual_seed(0)
    model = DemoDiT(DemoConfig()).eval()
    x = torch.randn(5, 3, RESOLUTION, RESOLUTION)
    tokens = tokenize(["a red circle", "", "a blue cross", "a cyan square", "a green triangle"])
    assert tokens.shape == (5, 2) and tokens.dtype == torch.long
    assert tokens[1].tolist() == [0, 0]
    with torch.no_grad():
        v = model(x, torch.rand(5), tokens)
    assert v.shape == x.shape and torch.isfinite(v).all()
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert {"to_q", "to_k", "to_v", "to_out"} <= names
    n_attn = sum(1 for n, _ in model.named_modules() if n.endswith("to_q"))
    assert n_attn == model.config.depth
    with pytest.raises(ValueError, match=f"makes {RESOLUTION}×{RESOLUTION} images, not 8×32: set width and height "
                                         f"to {RESOLUTION}"):
        model(torch.randn(2, 3, 32, 8), torch.rand(2), tokens[:2])
    with pytest.raises(ValueError, match="takes 3-channel latents .* demo model's own VAE"):
        model(torch.randn(2, 4, RESOLUTION, RESOLUTION), torch.rand(2), tokens[:2])


def test_load_demo_model_round_trip(tmp_path):
    torch.manual_seed(1)
    cfg = DemoConfig(hidden=32, depth=2, heads=2)
    model = DemoDiT(cfg)
    for p in model.parameters():  # the zero-initialised output layers would hide a bad load
        nn.init.normal_(p, std=0.05)
    path = tmp_path / "m.safetensors"
    save_demo_model(model, path)
    assert not list(tmp_path.glob("*.tmp"))
    loaded = load_demo_model(path)
    assert loaded.config == cfg
    x, s, t = torch.randn(3, 3, 16, 16), torch.rand(3), tokenize(["a red circle"] * 3)
    with torch.no_grad():
        assert torch.equal(model.eval()(x, s, t), loaded(x, s, t))


def test_load_demo_model_errors(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(FileNotFoundError, match="pretrain"):
        load_demo_model(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_demo_model(junk)
    with pytest.raises(ValueError, match="not a demo flow model"):
        load_demo_model(DEFAULT_CLASSIFIER_PATH)
    # right metadata, wrong tensors: missing keys and a shape mismatch are both named
    cfg = DemoConfig(hidden=32, depth=2, heads=2)
    state = {k: v.clone() for k, v in DemoDiT(cfg).state_dict().items()}
    state.pop("blocks.1.attn.to_q.weight")
    state["proj_out.weight"] = torch.zeros(5, 32)
    state["extra"] = torch.zeros(1)
    bad = tmp_path / "bad.safetensors"
    save_file(state, str(bad), metadata={"format": "treegrpo-demo-flow", "config": cfg.to_json()})
    with pytest.raises(ValueError) as e:
        load_demo_model(bad)
    msg = str(e.value)
    assert "blocks.1.attn.to_q.weight" in msg and "proj_out.weight" in msg and "extra" in msg


def test_shipped_weights_are_small():
    assert DEFAULT_FLOW_PATH.stat().st_size + DEFAULT_CLASSIFIER_PATH.stat().st_size <= 10 * 2**20


# ---------------------------------------------------------------- policy


def test_policy_protocol_schedule_and_prompts(policy):
    assert isinstance(policy, Policy)
    assert policy.prediction == "flow"
    assert policy.latent_shape() == (3, RESOLUTION, RESOLUTION)
    s = policy.sigmas(10)
    assert s.shape == (11,) and s.dtype == torch.float32
    assert torch.allclose(s, torch.linspace(1, 0, 11))
    shifted = DemoPolicy(policy.model, shift=3.0).sigmas(4)
    raw = torch.linspace(1, 0, 5)
    assert torch.allclose(shifted, 3 * raw / (1 + 2 * raw))
    assert shifted[0] == 1 and shifted[-1] == 0 and (shifted.diff() < 0).all()
    cond = policy.encode_prompts(["a red circle", "a blue cross"])
    assert cond["tokens"].shape == cond["uncond"].shape == (2, 2)
    assert cond["uncond"].eq(0).all()
    neg = policy.encode_prompts(["a red circle"], negative="a green square")
    assert neg["uncond"].tolist() == tokenize(["a green square"]).tolist()
    with pytest.raises(ValueError, match="purple"):
        policy.encode_prompts(["a purple circle"])


def test_policy_denoise_cfg1_and_cfg3_single_batched_forward(policy):
    calls = []
    handle = policy.model.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 3, 16, 16, generator=g)
        sigma = torch.tensor([1.0, 0.7, 0.4, 0.1])
        cond = policy.encode_prompts(["a red circle", "a blue cross", "a yellow square", "a cyan triangle"])
        with torch.no_grad():
            x0 = policy.denoise(x, sigma, cond, cfg=1.0)
            assert calls == [4]
            v = policy.model(x, sigma, cond["tokens"])
            assert torch.allclose(x0, x - sigma.view(-1, 1, 1, 1) * v, atol=1e-6)
            calls.clear()
            x0_cfg = policy.denoise(x, sigma, cond, cfg=3.0)
            assert calls == [8]  # cond + uncond in ONE forward
            v_u = policy.model(x, sigma, cond["uncond"])
            expect = x - sigma.view(-1, 1, 1, 1) * (v_u + 3.0 * (v - v_u))
            assert torch.allclose(x0_cfg, expect, atol=1e-5)
    finally:
        handle.remove()
    img = policy.decode(x0)
    assert img.dtype == torch.float32 and img.min() >= 0 and img.max() <= 1


def test_policy_lora_disabled_with_peft():
    peft = pytest.importorskip("peft")
    model = load_demo_model()
    base = DemoPolicy(model)
    g = torch.Generator().manual_seed(0)
    x, sigma = torch.randn(2, 3, 16, 16, generator=g), torch.tensor([0.8, 0.3])
    cond = base.encode_prompts(["a red circle", "a blue cross"])
    with torch.no_grad():
        ref = base.denoise(x, sigma, cond, cfg=1.0)
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out"], init_lora_weights=False)
    lora_model = peft.inject_adapter_in_model(cfg, model)
    lora_params = [n for n, p in lora_model.named_parameters() if "lora_" in n]
    assert len(lora_params) == 2 * 4 * lora_model.config.depth
    pol = DemoPolicy(lora_model)
    with torch.no_grad():
        out = pol.denoise(x, sigma, cond, cfg=1.0)
        assert not torch.allclose(out, ref, atol=1e-4)
        with pol.lora_disabled():
            assert torch.allclose(pol.denoise(x, sigma, cond, cfg=1.0), ref, atol=1e-6)
        assert torch.allclose(pol.denoise(x, sigma, cond, cfg=1.0), out)


# ---------------------------------------------------------------- reward


def test_reward_registry_and_generator_images(reward):
    assert "demo_adherence" in available()
    assert isinstance(load_reward("demo_adherence"), DemoAdherence)
    g = torch.Generator().manual_seed(7)
    images, c, s = sample_batch(96, g)
    prompts = [f"a {COLOURS[i]} {SHAPES[j]}" for i, j in zip(c.tolist(), s.tolist())]
    r = reward(images, prompts)
    assert r.shape == (96,) and r.dtype == torch.float32
    assert r.mean() > 0.95
    wrong = [f"a {COLOURS[(i + 1) % len(COLOURS)]} {SHAPES[j]}" for i, j in zip(c.tolist(), s.tolist())]
    assert reward(images, wrong).mean() < 0.05
    # other resolutions are resized (antialiased) first
    big = torch.nn.functional.interpolate(images, size=(64, 64), mode="nearest")
    assert reward(big, prompts).mean() > 0.9


def test_reward_input_errors(reward):
    images = render([0, 1], [0, 1], torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="prompts"):
        reward(images, ["a red circle"])
    with pytest.raises(ValueError, match="purple"):
        reward(images, ["a red circle", "a purple square"])
    with pytest.raises(ValueError, match="B, 3, H, W"):
        reward(images[:, :1], ["a red circle", "a green square"])


# ---------------------------------------------------------------- the base model leaves RL headroom


def _sample_with_policy(policy: DemoPolicy, prompts: list[str], steps: int, cfg: float, seed: int) -> torch.Tensor:
    """Euler ODE through the Policy protocol: v = (x − x̂0)/σ, x ← x + (σ' − σ)·v."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(prompts), *policy.latent_shape(), generator=g)
    cond = policy.encode_prompts(prompts)
    sigmas = policy.sigmas(steps)
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            sig = s.expand(len(prompts))
            v = (x - policy.denoise(x, sig, cond, cfg)) / s
            x = x + (s_next - s) * v
    return policy.decode(x)


@pytest.mark.slow
def test_base_model_is_decent_but_imperfect(policy, reward):
    prompts = [p for p in all_prompts() for _ in range(8)]
    images = _sample_with_policy(policy, prompts, steps=10, cfg=1.0, seed=0)
    r1 = reward(images, prompts).mean().item()
    # chance for a random guess among 24 (colour, shape) pairs is ~0.04
    assert 0.25 < r1 < 0.8, r1
    # the samples are shapes on the background: the judge is confident about *something*
    pc, ps = reward.classifier.probabilities(images)
    assert (pc.max(-1).values * ps.max(-1).values).mean() > 0.5
    # same noise through the bare sampler gives the same images
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(len(prompts), 3, 16, 16, generator=g)[:16]
    x = euler_sample(policy.model, noise, tokenize(prompts[:16]), steps=10, cfg=1.0)
    assert torch.allclose(((x + 1) / 2).clamp(0, 1), images[:16], atol=1e-4)
    # guidance helps: the headroom is reachable
    images3 = _sample_with_policy(policy, prompts, steps=10, cfg=3.0, seed=0)
    assert reward(images3, prompts).mean().item() > r1


# ---------------------------------------------------------------- regeneration script


@pytest.mark.slow
def test_pretrain_smoke_is_deterministic(tmp_path):
    from safetensors import safe_open

    args = ["--classifier-steps", "3", "--flow-steps", "2", "--batch", "16", "--min-accuracy", "0"]
    args += ["--eval-per-prompt", "1", "--eval-images", "64", "--threads", "1"]
    pretrain.main(["--out", str(tmp_path / "a"), *args])
    pretrain.main(["--out", str(tmp_path / "b"), *args])
    for name in (pretrain.FLOW_FILE, pretrain.CLASSIFIER_FILE):
        with safe_open(str(tmp_path / "a" / name), "pt") as fa, safe_open(str(tmp_path / "b" / name), "pt") as fb:
            assert fa.metadata() == fb.metadata()
            assert sorted(fa.keys()) == sorted(fb.keys())
            for k in fa.keys():
                assert torch.equal(fa.get_tensor(k), fb.get_tensor(k)), k
    assert not list((tmp_path / "a").glob("*.tmp"))
    load_demo_model(tmp_path / "a" / pretrain.FLOW_FILE)
    load_classifier(tmp_path / "a" / pretrain.CLASSIFIER_FILE)
