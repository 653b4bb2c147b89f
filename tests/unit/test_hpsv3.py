"""The ``hpsv3`` reward (treegrpo/rewards/hpsv3.py) on a tiny random HPSv3 in the published layout (a Qwen2-VL config
and processor, ``HPSv3.safetensors`` with transformers 4.x key names and the ``<|Reward|>`` token): the score is the
head's first output at the reward token, recomputed here by hand from the file's tensors; the input follows the
reference (the instruction with the prompt, 256·28·28 pixels); wrong files are refused. Random weights: this checks
the computation, not the model's judgement."""
import json
import os

import pytest
import torch

import reward_fixtures as rf
from treegrpo.rewards.base import load_reward


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return rf.make_hpsv3_folder(str(tmp_path_factory.mktemp("hpsv3") / "HPSv3"))


def test_the_score_is_mu_at_the_reward_token_by_hand(folder):
    from safetensors.torch import load_file
    from transformers import AutoConfig, Qwen2VLForConditionalGeneration

    from treegrpo.rewards.hpsv3 import INSTRUCTION, PIXELS, REWARD_PROMPT

    r = load_reward("hpsv3", path=folder, batch_size=2)
    imgs = torch.rand(3, 3, 64, 80, generator=torch.Generator().manual_seed(0))
    prompts = ["a red fox in the snow", "a cat", "a storefront sign that says \"OPEN\""]
    got = r(imgs, prompts)
    assert got.shape == (3,) and got.std() > 0
    # by hand: the file's backbone weights in a plain Qwen2-VL, the head as matrix products
    state = load_file(os.path.join(folder, "HPSv3.safetensors"))
    cfg = AutoConfig.from_pretrained(folder)
    cfg.text_config.vocab_size = state["model.embed_tokens.weight"].shape[0]
    vlm = Qwen2VLForConditionalGeneration(cfg).eval()
    mapped = {}
    for k, v in state.items():
        if k.startswith("rm_head."):
            continue
        k = ("model." + k) if k.startswith("visual.") else k.replace("model.", "model.language_model.", 1) \
            if k.startswith("model.") else k
        mapped[k] = v
    vlm.load_state_dict(mapped, strict=True)
    w = {k[len("rm_head."):]: v.double() for k, v in state.items() if k.startswith("rm_head.")}
    for i in range(3):
        enc = r.inputs(imgs[i:i + 1], prompts[i:i + 1])
        text = r.processor.tokenizer.decode(enc["input_ids"][0])
        assert INSTRUCTION.format(text_prompt=prompts[i]) + REWARD_PROMPT in text
        assert int(enc["image_grid_thw"][0].prod()) * 14 * 14 == pytest.approx(PIXELS, rel=0.1)
        with torch.no_grad():
            h = vlm.model(**enc).last_hidden_state[0].double()
        x = h[int((enc["input_ids"][0] == r.reward_token_id).nonzero()[0, 0])]
        x = torch.relu(w["0.weight"] @ x + w["0.bias"])
        x = torch.relu(w["3.weight"] @ x + w["3.bias"])
        mu = float((w["5.weight"] @ x + w["5.bias"])[0])
        assert float(got[i]) == pytest.approx(mu, rel=1e-4, abs=1e-5)


def test_wrong_files_are_refused(folder, tmp_path):
    import shutil

    with pytest.raises(FileNotFoundError, match="hpsv3: no path given.*HPSv3.safetensors"):
        load_reward("hpsv3")
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    os.unlink(bare / "HPSv3.safetensors")
    with pytest.raises(FileNotFoundError, match="lacks HPSv3.safetensors.*MizzenAI/HPSv3"):
        load_reward("hpsv3", path=str(bare))
    from safetensors.torch import save_file
    save_file({"model.embed_tokens.weight": torch.zeros(400, 32), "junk": torch.zeros(1)},
              str(bare / "HPSv3.safetensors"))
    with pytest.raises(ValueError, match="does not fit Qwen2-VL with the HPSv3 head"):
        load_reward("hpsv3", path=str(bare))
    whole = (bare / "HPSv3.safetensors").read_bytes()
    (bare / "HPSv3.safetensors").write_bytes(whole[:-8])
    with pytest.raises(ValueError, match="hpsv3: .*HPSv3.safetensors is incomplete"):
        load_reward("hpsv3", path=str(bare))
    # another Qwen2-VL's config beside the weights (a vlm_judge folder's 2B config): one line, not 30 size mismatches
    mism = tmp_path / "mism"
    shutil.copytree(folder, mism)
    cfg = json.loads((mism / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text["intermediate_size"] = 2 * text["intermediate_size"]
    (mism / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        load_reward("hpsv3", path=str(mism))
    assert "\n" not in str(e.value) and "does not fit the config.json in" in str(e.value) \
        and "put Qwen2-VL-7B-Instruct's config and processor files beside HPSv3.safetensors" in str(e.value)


def test_it_trains_and_judges_a_cli_run(folder, tmp_path):
    import json

    from treegrpo import cli

    d = cli.demo_config_dict()
    d.update(iterations=1, eval_every=1, eval_seeds=1, prompts_per_iter=2, output_dir=str(tmp_path / "out"),
             rewards=[{"name": "hpsv3", "path": folder}], eval_rewards=[{"name": "hpsv3", "path": folder}])
    (tmp_path / "c.json").write_text(json.dumps(d))
    assert cli.main(["train", "--config", str(tmp_path / "c.json"), "--quiet"]) == 0
    log = json.loads((tmp_path / "out" / "log.json").read_text())
    import math
    assert math.isfinite(log["train"][0]["reward/hpsv3"]) and all(math.isfinite(e["judge/hpsv3"]) for e in log["eval"])


def test_its_vision_tower_gives_taste_features(folder):
    from treegrpo.artist.features import feature_encoder

    f = feature_encoder("reward:hpsv3", path=folder)(torch.rand(3, 3, 48, 48, generator=torch.Generator().manual_seed(4)))
    assert f.shape[0] == 3 and torch.allclose(f.norm(dim=-1), torch.ones(3), atol=1e-4) and not torch.allclose(f[0], f[1])
