"""LoRA with PEFT: export → import round trip in ComfyUI and PEFT formats, real module names, atomic
and corrupt-file handling."""
import os

import pytest
import torch
from torch import nn

from treegrpo.config import LoraConfig
from treegrpo.lora import (LoraFileError, add_lora, extract_lora, from_state_dict, load_into_model, read_lora_file,
                           save_lora_file, to_comfy, to_peft)


class Attn(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1)
        return self.to_out(a @ v)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.ModuleDict({"attn": Attn()}) for _ in range(2)])
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        for b in self.blocks:
            x = x + b["attn"](x)
        return self.proj(x)


def _trained(seed=0, rank=4, alpha=8.0):
    torch.manual_seed(seed)
    net = Net()
    params = add_lora(net, LoraConfig(rank=rank, alpha=alpha))
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.3)
    return net, params


def test_add_lora_freezes_base_and_targets_attention_only():
    net, params = _trained()
    assert all(not p.requires_grad for n, p in net.named_parameters() if "lora_" not in n)
    assert len(params) == 2 * 4 * 2
    assert not any("proj.lora" in n for n, _ in net.named_parameters())
    with pytest.raises(ValueError, match="match no nn.Linear"):
        add_lora(Net(), LoraConfig(targets=["qkv"]))


@pytest.mark.parametrize("fmt", ["comfy", "peft"])
def test_round_trip_reproduces_outputs(tmp_path, fmt):
    net, _ = _trained()
    x = torch.randn(2, 5, 8)
    y = net(x)
    w = extract_lora(net)
    sd = to_comfy(w) if fmt == "comfy" else to_peft(w, prefix="")
    path = save_lora_file(str(tmp_path / "l.safetensors"), sd, {"treegrpo.lora_alpha": "8.0", "treegrpo.step": 3})
    tensors, meta = read_lora_file(path)
    assert meta["treegrpo.step"] == "3"
    torch.manual_seed(0)
    fresh = Net()                       # same base weights (same seed), fresh zero-initialised LoRA
    add_lora(fresh, LoraConfig(rank=4, alpha=8.0))
    assert not torch.allclose(fresh(x), y)
    load_into_model(fresh, from_state_dict(tensors, meta))
    assert torch.allclose(fresh(x), y, atol=1e-6)


def test_comfy_keys_name_real_modules_and_match_hand_merge():
    net, _ = _trained()
    sd = to_comfy(extract_lora(net))
    modules = dict(net.named_modules())
    for k in sd:
        assert k.startswith("diffusion_model.")
        mod = k[len("diffusion_model."):].rsplit(".", 2 if k.endswith("weight") else 1)[0]
        assert mod in modules and hasattr(modules[mod], "base_layer"), k
    # merge W + (alpha/r)·up·down by hand into a LoRA-free copy: same function
    torch.manual_seed(0)
    plain = Net()
    with torch.no_grad():
        for k in sd:
            if k.endswith(".lora_down.weight"):
                mod = k[len("diffusion_model."):-len(".lora_down.weight")]
                up, down = sd[k.replace("lora_down", "lora_up")], sd[k]
                alpha = float(sd[k.replace(".lora_down.weight", ".alpha")])
                plain.get_submodule(mod).weight += alpha / down.shape[0] * up @ down
    x = torch.randn(3, 4, 8)
    assert torch.allclose(plain(x), net(x), atol=1e-5)


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(LoraFileError, match="not found"):
        read_lora_file(str(tmp_path / "missing.safetensors"))
    net, _ = _trained()
    path = save_lora_file(str(tmp_path / "l.safetensors"), to_comfy(extract_lora(net)))
    data = open(path, "rb").read()
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(LoraFileError, match="truncated or corrupt"):
        read_lora_file(str(trunc))
    other, _ = _trained(rank=2, alpha=2.0)
    with pytest.raises(LoraFileError, match="shapes do not match"):
        load_into_model(other, from_state_dict(*read_lora_file(path)))
    with pytest.raises(LoraFileError, match="no LoRA tensors"):
        from_state_dict({"x.weight": torch.zeros(2)})
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]
