"""The ``ocr`` reward (treegrpo/rewards/ocr.py): the text rule against hand-computed edit distances, and the real
RapidOCR PP-OCRv6 models (inside the rapidocr 3.10 wheel; the README's test command installs it) on text drawn with
PIL in the fonts matplotlib ships (so every machine has them) and Pillow's own (tests/reward_fixtures.py)."""

import pytest
import torch

from reward_fixtures import FACES
from reward_fixtures import drawn_text as drawn
from treegrpo.rewards.ocr import check_prompts, levenshtein, normalise, quoted_text, text_reward


def test_the_text_rule_by_hand():
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "open") == 4 and levenshtein("open", "open") == 0
    assert levenshtein("flaw", "lawn") == 2
    assert quoted_text('a storefront sign that says "OPEN"') == "OPEN"
    assert quoted_text('a poster: “Big Sale” and "50% off"') == "Big Sale 50% off"
    assert quoted_text("a cat's hat") == "" and quoted_text('empty quotes ""') == ""
    # the quotes of other languages (a user's walk: these were refused as quoting nothing)
    assert quoted_text("ein Schild „Guten Tag“") == "Guten Tag" and quoted_text("un panneau « Bonjour »") == "Bonjour"
    assert quoted_text("看板に「東京」") == "東京" and quoted_text("『本』と「店」") == "本 店"
    # an inch mark is no quote (it took 'vinyl record labelled' for the text)
    assert quoted_text('a 12" vinyl record labelled "HELLO"') == "HELLO"
    assert quoted_text('"OPEN" on a 7" sign, "24h"') == "OPEN 24h"
    assert normalise(" Hello\tWorld \n") == "helloworld"
    assert text_reward("OPEN", "OPEN") == 1.0 and text_reward("open", "OPEN") == 1.0     # case is ignored
    assert text_reward("HelloWorld", "Hello World") == 1.0                              # so is whitespace
    assert text_reward("", "OPEN") == 0.0                                               # nothing read
    assert text_reward("OPFN", "OPEN") == pytest.approx(0.75)                           # 1 − 1/4
    assert text_reward("OPENOPENOPEN", "OPEN") == 0.0                                   # d = 8, capped at |t|
    assert text_reward("COFFEE SHOP", "COFFEE") == pytest.approx(1 - 4 / 6)               # 4 letters too many
    with pytest.raises(ValueError, match="empty once whitespace is removed"):
        text_reward("x", "  ")
    check_prompts(['a sign that says "OPEN"'])
    with pytest.raises(ValueError, match=r"1 prompt\(s\) quote none: 'a red circle'. Put the text in quotes \("):
        check_prompts(['a sign that says "OPEN"', "a red circle"])


WORDS = ["OPEN", "COFFEE", "SUMMIT 2 KM"]


@pytest.fixture(scope="module")
def ocr():
    pytest.importorskip("rapidocr", reason="the README's test command installs rapidocr")
    from treegrpo.rewards.base import load_reward
    return load_reward("ocr")


@pytest.mark.slow
def test_drawn_text_reads_back(ocr):
    """Every word in four fonts at 32 px on 256 px, 56 px on 384 px and 24 px on 512 px pictures reads back with a
    reward ≥ 0.9, mean ≥ 0.97 (measured: all 36 exact, even 'SUMMIT 2 KM' in DejaVu Serif at 56 px, 430 px wide on
    384: its edges are cut; one letter of it wrong would be 0.889)."""
    images, prompts = [], []
    for word in WORDS:
        for face in FACES:
            for px, size in ((32, 256), (56, 384), (24, 512)):
                images.append(drawn(word, face, px, size))
                prompts.append(f'a sign that says "{word}"')
    by_size = {}
    for img, p in zip(images, prompts):
        by_size.setdefault(img.shape[-1], []).append((img, p))
    scores = []
    for group in by_size.values():
        scores += ocr(torch.stack([g[0] for g in group]), [g[1] for g in group]).tolist()
    print("ocr on drawn text:", [round(s, 3) for s in scores])
    assert sum(scores) / len(scores) >= 0.97 and min(scores) >= 0.9, scores


def test_noise_and_wrong_words_score_low_and_legibility_orders(ocr):
    g = torch.Generator().manual_seed(0)
    noise = torch.rand(2, 3, 256, 256, generator=g)
    blank = torch.full((1, 3, 256, 256), 0.9)
    wrong = torch.stack([drawn("CLOSED", "DejaVuSans.ttf"), drawn("TEA", "DejaVuSerif.ttf")])
    s = ocr(torch.cat([noise, blank, wrong]), ['a sign that says "OPEN"'] * 3 + ['says "OPEN"', 'says "COFFEE"'])
    print("ocr on noise, blank, wrong words:", s.tolist())
    assert s[:3].max() == 0.0 and s[3:].max() <= 0.4, s
    # the same word with more of it hidden: the reward never rises, and falls from all of it to none of it
    word = "BAKERY"
    covers = [0.0, 0.35, 0.7, 1.0]
    s = ocr(torch.stack([drawn(word, "DejaVuSans.ttf", 48, cover=c) for c in covers]), [f'says "{word}"'] * 4)
    print("ocr with", covers, "of the word hidden:", s.tolist())
    assert all(a >= b for a, b in zip(s.tolist(), s.tolist()[1:])), s
    assert s[0] >= 0.9 and s[-1] == 0.0 and s[0] > s[2], s


def test_prompts_without_quoted_text_are_refused_before_any_model(tmp_path, capsys):
    """The CLI refuses a run whose prompts quote no text (exit 2, one line naming the field and the prompt) before a
    model is loaded; the evaluation prompts are checked too, for a training reward and for a judge."""
    import json

    from treegrpo import cli

    cfg = {"prompts": ['a sign that says "OPEN"', "a red circle"], "rewards": [{"name": "ocr"}],
           "output_dir": str(tmp_path / "out"), "iterations": 1}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert cli.main(["train", "--config", str(tmp_path / "c.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "TrainConfig.rewards[0]: reward 'ocr'" in err and "'a red circle'" in err, err
    cfg.update(prompts=['a sign that says "OPEN"'], rewards=[{"name": "hpsv2", "path": "x"}],
               eval_rewards=[{"name": "ocr"}], eval_prompts=["a dog"])
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert cli.main(["train", "--config", str(tmp_path / "c.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "TrainConfig.eval_rewards[0]: reward 'ocr'" in err and "'a dog'" in err, err
    # text the recogniser cannot write out (a user's walk: Cyrillic read as nothing, reward 0 for ever): refused too
    cfg.update(prompts=['a sign that says "OPEN"', 'a sign "ПРИВЕТ"'], rewards=[{"name": "ocr"}], eval_rewards=[],
               eval_prompts=[])
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert cli.main(["train", "--config", str(tmp_path / "c.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "TrainConfig.rewards[0]: reward 'ocr' reads with PP-OCRv6, whose recogniser knows no 'ВЕИПРТ'" in err, err
    assert "1 prompt(s) quote text it can never read back ('a sign \"ПРИВЕТ\"')" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_recogniser_knows_what_the_prompts_may_quote():
    """The characters come from the recogniser's own file: Latin with accents, Chinese, kana, digits; not Cyrillic
    or Hangul (drawn with PIL in a walk: 'ПРИВЕТ' and 'Привет мир' were read as '')."""
    from treegrpo.rewards.ocr import recogniser_characters

    known = recogniser_characters()
    assert known is not None and len(known) > 10000
    assert set("OPENcafé Straße 12 东京こんにちは-!?") - {" "} <= known
    assert not set("ПРИВЕТпривет") & known and not set("한국") & known


def test_a_rapidocr_without_its_models_is_refused_before_anything_is_downloaded(monkeypatch):
    """Another rapidocr release (2.x fetches its models from the internet at first use) lacks the model files the
    reward names: refused with the files, the folder and the install command, and RapidOCR is never constructed."""
    pytest.importorskip("rapidocr")
    import rapidocr

    from treegrpo.rewards.ocr import OCRReward

    monkeypatch.setattr(OCRReward, "MODEL_FILES", dict(OCRReward.MODEL_FILES, Rec="PP-OCRv9_rec.onnx"))
    monkeypatch.setattr(rapidocr, "RapidOCR", lambda *a, **k: pytest.fail("RapidOCR was constructed"))
    with pytest.raises(ImportError, match=r"models lacks PP-OCRv9_rec.onnx .*pip install --no-deps "
                                          r"rapidocr==3\.10\.0"):
        OCRReward()
    with pytest.raises(ValueError, match="threads must be a whole number"):
        OCRReward(threads=-1)


def test_on_a_cuda_device_onnx_runtime_is_asked_for_that_card_and_reads_on_the_cpu_without_it(monkeypatch, ocr):
    """The run's device reaches RapidOCR: on ``cuda:1`` its ONNX Runtime settings ask for the CUDA provider on card
    1 (convolutions chosen by heuristic); this machine's onnxruntime has no CUDA provider, so RapidOCR reads on the
    CPU and the reward equals the CPU reward's. On the CPU nothing of CUDA is set."""
    import rapidocr

    from treegrpo.rewards.ocr import OCRReward, engine_device_params

    assert engine_device_params("cpu") == {} and engine_device_params(torch.device("cpu")) == {}
    assert engine_device_params("cuda") == {"EngineConfig.onnxruntime.use_cuda": True,
                                            "EngineConfig.onnxruntime.cuda_ep_cfg.device_id": 0,
                                            "EngineConfig.onnxruntime.cuda_ep_cfg.cudnn_conv_algo_search":
                                                "HEURISTIC"}
    seen, real = [], rapidocr.RapidOCR
    monkeypatch.setattr(rapidocr, "RapidOCR", lambda params: seen.append(params) or real(params=params))
    on_gpu = OCRReward(device="cuda:1")
    assert seen[0]["EngineConfig.onnxruntime.use_cuda"] is True
    assert seen[0]["EngineConfig.onnxruntime.cuda_ep_cfg.device_id"] == 1
    assert on_gpu.engine.cfg.EngineConfig.onnxruntime.cuda_ep_cfg.device_id == 1     # RapidOCR took it
    images = torch.stack([drawn("OPEN", FACES[0], 32, 256), drawn("COFFEE", FACES[1], 32, 256)])
    prompts = ['a sign that says "OPEN"', 'a sign that says "COFFEE"']
    assert torch.equal(on_gpu(images, prompts), ocr(images, prompts))
    OCRReward(device="cpu")
    assert not any(k.startswith("EngineConfig.onnxruntime.use_cuda") for k in seen[1])


def test_the_train_node_checks_the_text_the_ocr_reward_reads_and_says_where_brackets_went(caplog):
    """In ComfyUI the reward reads a prompt without its weighting syntax: a quoted text that is only an embedding
    name is refused, and brackets that are emphasis (not \\( \\)) inside the quoted text are said once."""
    import logging
    from treegrpo.comfyui.train_node import check_reward_prompts
    from treegrpo.config import TrainConfig

    ocr = [{"name": "ocr"}]
    with pytest.raises(ValueError, match="quote none"):
        tc = TrainConfig(prompts=['a sign "embedding:neon"'], rewards=ocr)
        check_reward_prompts(tc, tc.prompts)
    with caplog.at_level(logging.WARNING):
        tc = TrainConfig(prompts=['a sign "OPEN (24h)"', 'a mug (glossy:1.2) "HI \\(2\\)"'], rewards=ocr)
        check_reward_prompts(tc, tc.prompts)
    said = [r.getMessage() for r in caplog.records if "weighting syntax" in r.getMessage()]
    assert len(said) == 1 and "'OPEN (24h)' is read 'OPEN 24h'" in said[0] and "HI" not in said[0]
