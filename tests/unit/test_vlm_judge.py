"""The ``vlm_judge`` reward (treegrpo/rewards/vlm_judge.py) on a tiny random Qwen2-VL model built in the published
folder layout: P("Yes") recomputed by hand from the model's logits, batching equal to one image at a time, the
question's placeholder, wrong or missing folders refused clearly, its vision tower as taste features, and the reward
as a training reward and a held-out judge of a CLI run. The model is random: these check the computation only."""
import json
import re
from pathlib import Path

import pytest
import torch

import reward_fixtures as rf
from treegrpo.rewards.base import load_reward


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return rf.make_qwen2vl_folder(str(tmp_path_factory.mktemp("qwen2vl") / "Qwen2-VL-tiny"))


@pytest.fixture(scope="module")
def judge(folder):
    return load_reward("vlm_judge", path=folder, question="Does this image show: {prompt}?")


def _images(n, seed=0, size=56):
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_p_yes_is_the_softmax_of_the_answer_token_by_hand(judge):
    imgs, prompts = _images(3), ["a red circle", "a cat", "a storefront sign"]
    got = judge(imgs, prompts)
    from transformers import Qwen2VLForConditionalGeneration
    for i in range(3):                        # the model's own forward on one image, the formula written out
        enc = judge._inputs(imgs[i:i + 1], prompts[i:i + 1])
        text = judge.processor.tokenizer.decode(enc["input_ids"][0])
        assert f"Does this image show: {prompts[i]}?" in text and text.rstrip().endswith("assistant")
        with torch.no_grad():
            logits = judge.module(**enc).logits[0, -1].double()
        p = float(torch.exp(logits[judge.answer_id]) / torch.exp(logits).sum())
        assert float(got[i]) == pytest.approx(p, rel=1e-4, abs=1e-7)
        assert float(VLM.p_yes_by_hand(logits[None], judge.answer_id)[0]) == pytest.approx(p, rel=1e-9)
    assert isinstance(judge.module, Qwen2VLForConditionalGeneration)
    assert got.shape == (3,) and ((got > 0) & (got < 1)).all() and got.std() > 0


def test_batching_equals_one_by_one(folder):
    """Left padding puts every row's answer position last: questions of different lengths in one batch score as
    they do alone."""
    many = load_reward("vlm_judge", path=folder, batch_size=4)
    one = load_reward("vlm_judge", path=folder, batch_size=1)
    imgs = _images(4, seed=1)
    prompts = ["a red circle", "a very long prompt about a cat on a mat in the sun", "x", 'a sign that says "OPEN"']
    assert torch.allclose(many(imgs, prompts), one(imgs, prompts), rtol=1e-4, atol=1e-7)


def test_a_question_takes_the_prompt_as_it_is_and_says_when_it_takes_none():
    """A user's walk: ``{prompt.upper}`` put "<built-in method upper ...>" in the question, ``{prompt[0]}`` one
    letter, and a question without ``{prompt}`` asked the same of every image, all without a word. The first two are
    refused; the last is said (it can be meant: "Is the text legible?")."""
    from treegrpo.rewards.vlm_judge import DEFAULT_QUESTION, check_question

    assert check_question(DEFAULT_QUESTION) is None and check_question("Is {prompt} shown? {{yes}}") is None
    for bad, why in (("Is {prompt.upper} shown?", "{prompt.upper} is not {prompt}"),
                     ("{prompt[0]}", "{prompt[0]} is not {prompt}"), ("Is {text} shown?", "{text} is not {prompt}"),
                     ("Is {prompt shown?", "expected '}'"), ("", "must be a sentence"),
                     ("Is {prompt:{w}} shown?", "{prompt:{w}} is not {prompt}")):
        with pytest.raises(ValueError, match=re.escape(why)):
            check_question(bad)
    for none in ("Is the text legible? Answer yes or no.", "Is {{prompt}} shown?"):
        assert "has no {prompt}: it asks the same of every image" in check_question(none)


def test_missing_or_wrong_folders_and_questions_are_refused(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="vlm_judge: no path given.*Qwen2-VL"):
        load_reward("vlm_judge")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_reward("vlm_judge", path=str(tmp_path / "empty"))
    (tmp_path / "clip").mkdir()
    (tmp_path / "clip" / "config.json").write_text(json.dumps({"architectures": ["CLIPModel"]}))
    with pytest.raises(ValueError, match="holds a CLIPModel model; this reward runs Qwen2VL"):
        load_reward("vlm_judge", path=str(tmp_path / "clip"))
    with pytest.raises(ValueError, match="only placeholder is {prompt}"):
        load_reward("vlm_judge", path=folder, question="Is {subject} shown?")
    import shutil
    for name in ("noweights", "cut"):        # the config and processor, the weights missing or cut short
        shutil.copytree(folder, tmp_path / name, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError, match="vlm_judge: the model's weights in .*noweights cannot be read.*Expected"):
        load_reward("vlm_judge", path=str(tmp_path / "noweights"))
    whole = (Path(folder) / "model.safetensors").read_bytes()
    (tmp_path / "cut" / "model.safetensors").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="model.safetensors is incomplete"):
        load_reward("vlm_judge", path=str(tmp_path / "cut"))
    with pytest.raises(ValueError, match="question must be a sentence"):
        load_reward("vlm_judge", path=folder, question="  ")


def test_its_vision_tower_gives_taste_features(folder):
    from treegrpo.artist.features import feature_encoder

    enc = feature_encoder("reward:vlm_judge", path=folder)
    f = enc(_images(3, seed=2))
    assert f.shape[0] == 3 and torch.allclose(f.norm(dim=-1), torch.ones(3), atol=1e-4)
    assert not torch.allclose(f[0], f[1])


VLM = None


@pytest.fixture(autouse=True, scope="module")
def _cls():
    global VLM
    from treegrpo.rewards.vlm_judge import VLMJudge
    VLM = VLMJudge


def test_it_trains_and_judges_a_cli_run(folder, tmp_path):
    """The judge as the training reward (its question written in the config) and as a held-out judge of a run trained
    on the demo reward: both runs finish and log its scores in [0, 1]."""
    from treegrpo import cli

    def run(name, **over):
        d = cli.demo_config_dict()
        d.update(iterations=1, eval_every=1, eval_seeds=1, prompts_per_iter=2, run_name=name,
                 output_dir=str(tmp_path / name), **over)
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
        assert cli.main(["train", "--config", str(tmp_path / f"{name}.json"), "--quiet"]) == 0
        return json.loads((tmp_path / name / "log.json").read_text())

    opts = {"question": "Is there a {prompt} in this picture?", "batch_size": 2}
    log = run("vlm_train", rewards=[{"name": "vlm_judge", "path": folder, "options": opts}])
    assert 0 < log["train"][0]["reward/vlm_judge"] < 1
    log = run("vlm_eval", eval_rewards=[{"name": "vlm_judge", "path": folder}])
    assert all(0 < e["judge/vlm_judge"] < 1 for e in log["eval"]), log["eval"]


def test_the_reward_model_loader_takes_the_question_as_text(comfyui_pack, folder, caplog):
    """In ComfyUI: the model folder in models/reward_models, the question typed into the loader's text box; the
    node's reward scores as load_reward with that question, and a question it cannot fill in is refused at
    validation."""
    import shutil
    from pathlib import Path

    import folder_paths

    root = Path(folder_paths.models_dir) / "reward_models"
    shutil.copytree(folder, root / "Qwen2-VL-tiny", dirs_exist_ok=True)
    loader = comfyui_pack.node_classes()["TreeGRPORewardModelLoader"]
    q = "Is the word {prompt} legible here?"
    out = loader.execute(reward="vlm_judge", file="Qwen2-VL-tiny/config.json", options="{}", question=q)
    node = (out.result[0] if hasattr(out, "result") else out[0])["model"]
    imgs, prompts = _images(2, seed=3), ["OPEN", "CAFE"]
    ref = load_reward("vlm_judge", path=folder, question=q)
    assert torch.allclose(node(imgs, prompts), ref(imgs, prompts), rtol=1e-4, atol=1e-7)
    assert not torch.allclose(ref(imgs, prompts), load_reward("vlm_judge", path=folder)(imgs, prompts))
    msg = loader.validate_inputs(reward="vlm_judge", options="{}", question="Is {thing} shown?")
    assert isinstance(msg, str) and "only placeholder is {prompt}" in msg
    assert loader.validate_inputs(reward="vlm_judge", options="{}", question=q) is True
    # the options' own question is checked at validation too (it was refused only when the node ran), and one the
    # question input replaces is said to be replaced
    msg = loader.validate_inputs(reward="vlm_judge", options='{"question": "Is {text} there?"}', question="")
    assert isinstance(msg, str) and "{text} is not {prompt}" in msg
    with caplog.at_level("WARNING"):
        loader.execute(reward="vlm_judge", file="Qwen2-VL-tiny/config.json", options='{"question": "Is it {prompt}?"}',
                       question=q)
    assert any("asks the loader's question" in r.getMessage() and "not the options'" in r.getMessage()
               for r in caplog.records)
    with caplog.at_level("WARNING"):      # a question left for another reward is said to be ignored
        loader.execute(reward="demo_adherence", file="(none: built-in weights or none needed)", options="{}",
                       question=q)
    assert any("read by the vlm_judge reward only; demo_adherence ignores it" in r.getMessage()
               for r in caplog.records)


def test_a_memory_plan_with_the_judge_as_reward_runs_and_says_what_it_could_not_measure(folder, tmp_path):
    """With a memory budget (every GPU run) the plan's shape-only probe cannot run the judge (its processor reads
    the images with numpy): the run starts (it stopped with a traceback) and says the judge's activations are not
    in the plan."""
    from treegrpo import cli

    d = cli.demo_config_dict()
    d.update(iterations=1, eval_every=0, prompts_per_iter=2, output_dir=str(tmp_path / "plan"),
             rewards=[{"name": "vlm_judge", "path": folder}], memory={"budget_gb": 4.0, "reuse_probe": False})
    (tmp_path / "plan.json").write_text(json.dumps(d))
    with pytest.warns(UserWarning, match="reward 'vlm_judge' prepares its images on the CPU"):
        assert cli.main(["train", "--config", str(tmp_path / "plan.json"), "--quiet"]) == 0
