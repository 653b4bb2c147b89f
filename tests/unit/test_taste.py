"""The taste model (treegrpo/artist/taste.py): the Bradley–Terry fit against closed forms and known weights, the bootstrap
ensemble's spread, the ask-when-unsure rule on constructed cases, the online loop, the file, and the taste as a
reward (the CLI's load_reward and rewards spec)."""
import json
import math

import pytest
import torch

from treegrpo.artist.answers import Answer, pairwise_wins
from treegrpo.artist.taste import (OnlineTaste, TasteConfig, TasteModel, fit_bradley_terry, from_labels,
                                   group_weights, should_ask, win_probability)
from treegrpo.run import build_rewards


def test_two_items_give_the_log_odds_of_their_wins():
    """One feature, item 0 minus item 1 = 1: with a wins of 0 and b of 1, the unpenalised MLE is θ = log(a/b); the
    ridge shrinks it (the stationarity condition a(1 − σ(θ)) − bσ(θ) = λθ holds at the penalised optimum)."""
    a, b = 7, 3
    d = torch.tensor([[1.0]] * a + [[-1.0]] * b)
    assert float(fit_bradley_terry(d, 0.0)[0]) == pytest.approx(math.log(a / b), abs=1e-9)
    lam = 2.0
    th = float(fit_bradley_terry(d, lam)[0])
    s = 1 / (1 + math.exp(-th))
    assert a * (1 - s) - b * s == pytest.approx(lam * th, abs=1e-9)
    assert 0 < th < math.log(a / b)
    # multiplicities are the same as repeated pairs; a fixed logit offset shifts the fit by itself
    assert float(fit_bradley_terry(torch.tensor([[1.0], [-1.0]]), 0.0, weights=torch.tensor([7.0, 3.0]))[0]) == \
        pytest.approx(math.log(a / b), abs=1e-9)
    assert float(fit_bradley_terry(d, 0.0, offset=torch.full((a + b,), 0.25 * 0))[0]) == pytest.approx(math.log(7 / 3))


def test_known_weights_are_recovered_from_simulated_choices():
    """Pairs drawn from a Bradley–Terry model with θ* on 3 features: 20 000 choices recover θ* within 0.06 (about
    4 standard errors of the MLE at this size)."""
    g = torch.Generator().manual_seed(0)
    theta = torch.tensor([1.5, -0.7, 0.3], dtype=torch.float64)
    x = torch.randn(20_000, 3, generator=g, dtype=torch.float64)
    first_wins = torch.rand(20_000, generator=g, dtype=torch.float64) < torch.sigmoid(x @ theta)
    d = torch.where(first_wins.unsqueeze(1), x, -x)          # winner minus loser
    est = fit_bradley_terry(d, 1e-6)
    assert torch.allclose(est, theta, atol=0.06), est


def _trees(n, g, dim=4):
    """n trees of 4 leaves with random features; the artist prefers the largest first feature."""
    out = []
    for _ in range(n):
        f = torch.randn(4, dim, generator=g)
        out.append((f, pairwise_wins(Answer("favourites", good=(int(f[:, 0].argmax()),)), 4)))
    return out


def test_the_ensemble_spread_shrinks_with_data_and_the_model_learns_the_taste():
    g = torch.Generator().manual_seed(1)
    data = _trees(200, g)
    probe = torch.randn(50, 4, generator=g)
    spreads = []
    for n in (5, 40, 200):
        m = TasteModel(config=TasteConfig(heads=8, l2=1.0))
        for f, p in data[:n]:
            m.add(f, p, refit=False)
        m.fit()
        spreads.append(float(m.head_scores(probe).std(0).mean() / m.head_scores(probe).mean(0).std()))
    assert spreads[0] > spreads[1] > spreads[2], spreads
    test = _trees(100, g)
    right = sum(int(m.scores(f).argmax() == f[:, 0].argmax()) for f, _ in test)
    assert right >= 80                                        # chance: 25
    assert m.agreement(*test[0]) is not None


def test_win_probability_and_when_to_ask():
    cfg = TasteConfig(heads=3, warmup_trees=2, confident=0.9, max_ask_rate=0.5)
    sure = torch.tensor([[5.0, 0.0, -1.0], [6.0, 0.5, -1.0], [4.0, 0.0, 0.0]])
    torn = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.2, 0.0]])   # the heads disagree on the top
    top, p = win_probability(sure)
    assert top == 0 and p == pytest.approx(float(torch.sigmoid(torch.tensor([5.0, 5.5, 4.0])).mean()))
    assert win_probability(torn)[1] < 0.6
    assert should_ask(sure, 0, 0, cfg) and should_ask(None, 5, 0, cfg)      # warm-up; no model yet
    assert not should_ask(sure, 5, 2, cfg)                                  # sure: the model scores it
    assert should_ask(torn, 5, 2, cfg)                                      # unsure, within the rate: 3 of 6
    assert not should_ask(torn, 5, 3, cfg)                                  # unsure, but 4 answers of 6 > 0.5
    with pytest.raises(ValueError, match="confident must be a probability"):
        TasteConfig(confident=0.3)
    with pytest.raises(ValueError, match="max_ask_rate"):
        TasteConfig(max_ask_rate=0)
    with pytest.raises(ValueError, match="heads"):
        TasteConfig(heads=0)


def test_online_rounds_ask_learn_and_score():
    """Asked trees get the answer's win rates, the others the model's scores; 'no preference' excludes a tree, an
    unanswered one before any model too; the agreement is taken before the model learns from the answer."""
    g = torch.Generator().manual_seed(2)
    enc = lambda imgs: imgs.flatten(1)[:, :4]                  # noqa: E731 - "features": the first 4 pixels
    taste = OnlineTaste(TasteModel(config=TasteConfig(heads=4, warmup_trees=2, confident=0.99, max_ask_rate=1.0)),
                        encoder=enc)
    leaf_tree = torch.arange(3).repeat_interleave(4)
    imgs = torch.rand(12, 3, 2, 2, generator=g)
    answers = {0: None, 1: [], 2: [(1, 0), (1, 2), (1, 3)]}
    asked = []

    def ask(t):
        asked.append(t)
        return answers[t]

    r, ex, st = taste.round(imgs, leaf_tree, ask)
    assert asked == [0, 1, 2] and ex.tolist() == [True, True, False]
    assert r[8:].tolist() == [0.0, 1.0, 0.0, 0.0] and st["taste_answers"] == 1 and st["taste_agreement"] is None
    answers2 = {t: [(0, 1), (0, 2), (0, 3)] for t in range(3)}
    r, ex, st = taste.round(imgs, leaf_tree, lambda t: answers2[t])
    assert st["taste_asked"] >= 1 and st["taste_agreement"] is not None and taste.trees_seen == 6


def test_save_load_round_trip_and_bad_files(tmp_path):
    g = torch.Generator().manual_seed(3)
    m = TasteModel(config=TasteConfig(heads=3), features="demo")
    for f, p in _trees(10, g, dim=176):
        m.add(f, p, refit=False)
    m.fit()
    path = tmp_path / "run_taste.safetensors"
    m.save(path, extra={"run_name": "run"})
    back = TasteModel.load(path)
    x = torch.randn(6, 176, generator=g)
    assert torch.allclose(back.scores(x), m.scores(x), atol=1e-5)
    assert back.config == m.config and back.info["answers"] == 10 and back.info["run_name"] == "run"
    with pytest.raises(ValueError, match=r"features must be \(leaves, 176\)"):
        back.scores(torch.randn(2, 5))
    cut = tmp_path / "cut_taste.safetensors"
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated"):
        TasteModel.load(cut)
    other = tmp_path / "lora.safetensors"
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, str(other), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="not a TreeGRPO taste model"):
        TasteModel.load(other)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TasteModel.load(tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="has not learned anything"):
        TasteModel().save(tmp_path / "empty.safetensors")


def test_a_taste_file_of_another_version_is_read_where_it_can_be(tmp_path, caplog):
    """A file written by a newer version with a setting this one does not know loads, with one warning naming the
    file, its version and the setting; one whose settings cannot be used is refused naming both versions."""
    import json as _json
    import logging

    from safetensors import safe_open
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(4)
    m = TasteModel(config=TasteConfig(heads=3), features="demo")
    for f, p in _trees(6, g, dim=176):
        m.add(f, p, refit=False)
    m.fit()
    path = tmp_path / "run_taste.safetensors"
    m.save(path)
    with safe_open(str(path), "pt") as fh:
        meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}

    def rewrite(name, **changes):
        out = tmp_path / name
        save_file(tensors, str(out), metadata={**meta, **changes})
        return out

    cfg = _json.loads(meta["config"])
    newer = rewrite("newer_taste.safetensors", version="2", config=_json.dumps({**cfg, "novelty_radius": 0.5}))
    with caplog.at_level(logging.WARNING):
        back = TasteModel.load(newer)
    assert back.config == m.config
    assert any("newer_taste.safetensors" in r.message and "version 2" in r.message and "novelty_radius" in r.message
               for r in caplog.records), caplog.text
    bad = rewrite("bad_taste.safetensors", version="2", config=_json.dumps({**cfg, "heads": "many"}))
    with pytest.raises(ValueError, match=r"bad_taste.safetensors.*format version 2; this TreeGRPO reads version 1"):
        TasteModel.load(bad)
    broken = rewrite("broken_taste.safetensors", version="3", config="[1, 2]")
    with pytest.raises(ValueError, match=r"format version 3.*cannot read"):
        TasteModel.load(broken)


def _demo_leaves(n_trees, seed):
    from treegrpo.demo.shapes import render
    return render([0] * (4 * n_trees), [0] * (4 * n_trees), torch.Generator().manual_seed(seed))


def test_the_taste_is_a_reward_for_load_reward_and_the_cli(tmp_path):
    """A taste for big shapes on the demo's encoder, saved, then loaded by load_reward('taste') and by the CLI's
    rewards spec: the same scores as the model, and bigger circles score higher."""
    from treegrpo import cli
    from treegrpo.config import TrainConfig
    from treegrpo.demo.shapes import shape_area
    from treegrpo.rewards.base import load_reward
    from treegrpo.artist.features import DemoEncoder

    enc = DemoEncoder()
    imgs = _demo_leaves(30, 0)
    m = TasteModel(config=TasteConfig(heads=3), features="demo")
    for t in range(30):
        x = imgs[4 * t:4 * t + 4]
        m.add(enc(x), pairwise_wins(Answer("favourites", good=(int(shape_area(x).argmax()),)), 4), refit=False)
    m.fit()
    path = tmp_path / "big_taste.safetensors"
    m.save(path)
    test = _demo_leaves(50, 1)
    r = load_reward("taste", path=str(path))
    s = r(test, ["a red circle"] * len(test))
    assert torch.allclose(s, m.scores(enc(test)), atol=1e-5)
    area = shape_area(test)
    corr = torch.corrcoef(torch.stack([s, area]))[0, 1]
    assert corr > 0.6, corr
    d = cli.demo_config_dict()
    d["rewards"] = [{"name": "taste", "weight": 1.0, "path": str(path)}]
    cfg = TrainConfig.from_dict(d)
    built = build_rewards(cfg, torch.device("cpu"))
    assert torch.allclose(built["taste"](test, ["x"] * len(test)), s)
    with pytest.raises(ValueError, match="needs the taste model's file"):
        load_reward("taste")


def test_a_run_learns_its_taste_again_from_its_labels(tmp_path):
    """from_labels: the answered trees of artist_labels.jsonl with their kept leaf images; a skip, a timeout and a
    last line cut off by a crash are passed over."""
    import numpy as np
    from PIL import Image

    from treegrpo.demo.shapes import shape_area
    from treegrpo.artist.features import DemoEncoder

    imgs = _demo_leaves(6, 4)
    recs = []
    for t in range(6):
        leaves = []
        for i in range(4):
            rel = f"artist/t{t}/leaf_{i}.png"
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            a = (imgs[4 * t + i].movedim(0, -1).numpy() * 255).round().astype(np.uint8)
            Image.fromarray(a).save(tmp_path / rel)
            leaves.append(rel)
        best = int(shape_area(imgs[4 * t:4 * t + 4]).argmax())
        outcome = "answered" if t < 4 else ("skip" if t == 4 else "timeout")
        recs.append({"tree": t, "iteration": t, "leaves": leaves, "outcome": outcome,
                     "answer": Answer("favourites", good=(best,)).to_dict() if t < 5 else None})
    text = "\n".join(json.dumps(r) for r in recs) + '\n{"tree": 9, "lea'
    (tmp_path / "artist_labels.jsonl").write_text(text)
    m = from_labels(tmp_path, DemoEncoder())
    assert m.answers == 4 and m.thetas is not None and m.feature_dim == 179 and m.groups == (128, 48, 3)
    assert from_labels(tmp_path / "nothing", DemoEncoder()).answers == 0
    # a run resumed at iteration 2 (its checkpoint's): the answers about iterations 2 and later came after it
    assert from_labels(tmp_path, DemoEncoder(), iteration=2).answers == 2


def test_a_taste_on_a_reward_models_image_tower(tmp_path):
    """Features from HPS v2's image tower (a tiny random-weight file in the real format): unit-norm embeddings; a
    taste learnt on them and saved with where the tower came from loads through load_reward('taste') alone."""
    import reward_fixtures as rf

    from treegrpo.rewards.base import load_reward
    from treegrpo.artist.features import feature_encoder

    path, arch = rf.make_hps_file(str(tmp_path))
    hps = load_reward("hpsv2", path=path, arch=arch)
    enc = feature_encoder("reward:hpsv2", reward=hps)
    imgs = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    f = enc(imgs)
    assert f.shape[0] == 8 and torch.allclose(f.norm(dim=-1), torch.ones(8), atol=1e-4)
    m = TasteModel(config=TasteConfig(heads=2), features=enc.name)
    m.add(f[:4], [(0, 1), (0, 2), (0, 3)])
    m.add(f[4:], [(1, 0), (1, 2), (1, 3)])
    out = tmp_path / "tower_taste.safetensors"
    m.save(out, extra={"features_path": enc.path, "features_options": enc.options})
    r = load_reward("taste", path=str(out))
    assert torch.allclose(r(imgs, ["p"] * 8), m.scores(f), atol=1e-4)
    with pytest.raises(ValueError, match="has no image tower"):
        feature_encoder("reward:jpeg_compressibility")


def test_the_train_node_picks_its_taste_features_or_says_what_to_connect():
    """CLIP Vision if connected, else a connected reward model's image tower, else the demo's encoder on the demo
    model; a real model with a reward model that has no tower (and no CLIP Vision) is refused naming what to connect."""
    from treegrpo.comfyui.artist.taste import ClipVisionEncoder, choose_encoder
    from treegrpo.artist.features import DemoEncoder

    class Tower:
        name = "hpsv2"

        def image_features(self, images):
            return images.flatten(1)

    assert isinstance(choose_encoder(object(), {"hpsv2": Tower()}), ClipVisionEncoder)
    assert choose_encoder(None, {"hpsv2": Tower()}).name == "reward:hpsv2"
    assert isinstance(choose_encoder(None, {"demo_adherence": object()}, demo=True), DemoEncoder)
    with pytest.raises(ValueError, match="connect a CLIP Vision model .* \\(connected: demo_adherence\\)"):
        choose_encoder(None, {"demo_adherence": object()}, demo=False)


def test_feature_groups_share_the_prior(tmp_path):
    """group_weights: c_g = √(D / (G·D_g)), so Σ_g D_g c_g² = D; a grouped model's heads are the Bradley–Terry fit
    on the standardised features times c (by hand), its file scores as it does and keeps the groups."""
    c = group_weights((2, 1), 3)
    assert torch.allclose(c, torch.tensor([math.sqrt(3 / 4)] * 2 + [math.sqrt(3 / 2)], dtype=torch.float64))
    assert float((c ** 2).sum()) == pytest.approx(3.0)
    assert torch.equal(group_weights((), 4), torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"feature groups \(2, 2\) must be sizes >= 1 summing to the features' 3"):
        group_weights((2, 2), 3)
    g = torch.Generator().manual_seed(3)
    feats = [torch.randn(4, 3, generator=g).double() * torch.tensor([1.0, 5.0, 0.2]).double() for _ in range(6)]
    answers = [[(int(f[:, 2].argmax()), j) for j in range(4) if j != int(f[:, 2].argmax())] for f in feats]
    m = TasteModel(config=TasteConfig(heads=1, l2=1.0), groups=(2, 1))
    for f, p in zip(feats, answers):
        m.add(f, p, refit=False)
    m.fit()
    allf = torch.cat(feats)
    z = (allf - allf.mean(0)) / allf.std(0, unbiased=False) * c
    d = torch.stack([z[4 * t + w] - z[4 * t + l] for t, p in enumerate(answers) for w, l in p])
    assert torch.allclose(m.thetas[0], fit_bradley_terry(d, 1.0), atol=1e-10)
    plain = TasteModel(config=TasteConfig(heads=1, l2=1.0))
    for f, p in zip(feats, answers):
        plain.add(f, p, refit=False)
    plain.fit()
    assert not torch.allclose(plain.thetas[0], m.thetas[0])    # the groups change the fit
    m.save(tmp_path / "g.safetensors")
    back = TasteModel.load(tmp_path / "g.safetensors")
    assert back.groups == (2, 1)
    assert torch.allclose(back.scores(allf), m.scores(allf), atol=1e-5)


def test_the_demo_encoder_sees_the_drawn_colour(tmp_path):
    """The demo features' colour group is the chroma²-weighted mean colour: exactly the drawn colour on a grey
    background, 0 for a grey picture; the first 176 features are the earlier encoder's, and a taste model saved on
    those still loads as a reward and scores as it did."""
    from treegrpo.artist.features import DemoEncoder, drawn_colour, feature_encoder
    from treegrpo.demo.shapes import BACKGROUND_RGB
    from treegrpo.rewards.base import load_reward

    grey = BACKGROUND_RGB.view(1, 3, 1, 1).repeat(2, 1, 16, 16).clone()
    grey[1, :, 2:9, 3:12] = torch.tensor([0.9, 0.3, 0.1]).view(3, 1, 1)
    assert torch.allclose(drawn_colour(grey), torch.tensor([[0.0, 0.0, 0.0], [0.9, 0.3, 0.1]]), atol=1e-6)
    enc, old = DemoEncoder(), DemoEncoder(colour=False)
    assert (enc.dim, enc.groups, old.dim, old.groups) == (179, (128, 48, 3), 176, ())
    imgs = _demo_leaves(3, 2)
    f = enc(imgs)
    assert f.shape == (12, 179) and torch.equal(f[:, :176], old(imgs))
    assert torch.allclose(f[:, 176:], drawn_colour(imgs), atol=1e-6)
    assert feature_encoder("demo", dim=176).dim == 176 and feature_encoder("demo").dim == 179
    m = TasteModel(config=TasteConfig(heads=2), features="demo")            # a file from before the colour group
    fo = old(imgs)
    for t in range(3):
        m.add(fo[4 * t:4 * t + 4], [(t, (t + 1) % 4)], refit=False)
    m.fit()
    m.save(tmp_path / "old.safetensors")
    r = load_reward("taste", path=str(tmp_path / "old.safetensors"))
    assert torch.allclose(r(imgs, ["a red circle"] * 12), m.scores(fo), atol=1e-5)


def test_an_artist_who_never_answers_is_asked_within_the_cap_and_nothing_unscored_is_trained():
    """Nobody answers: the warm-up trees are all asked, then (no model yet) at most ``max_ask_rate`` of the trees
    seen, never every tree; a tree neither answered nor scorable by a model is not trained on; once the last
    ``warmup_trees`` questions went unanswered the run is ``idle`` (the Train node stops it), and one answer with a
    preference ends that."""
    cfg = TasteConfig(heads=2, warmup_trees=4, max_ask_rate=0.5)
    taste = OnlineTaste(TasteModel(config=cfg), encoder=lambda imgs: imgs.flatten(1)[:, :4])
    leaf_tree = torch.arange(4).repeat_interleave(2)
    imgs = torch.rand(8, 3, 2, 2, generator=torch.Generator().manual_seed(3))
    asked = []
    assert not taste.idle
    r, ex, st = taste.round(imgs, leaf_tree, lambda t: asked.append(t))          # None: nobody answered
    assert asked == [0, 1, 2, 3] and ex.all() and st["taste_reasons"] == {"warm-up": 4} and taste.idle
    r, ex, st = taste.round(imgs, leaf_tree, lambda t: asked.append(4 + t))
    assert asked[4:] == [] and ex.all() and st["taste_asked"] == 0               # 5 asked of 5..8 seen > 0.5
    r, ex, st = taste.round(imgs, leaf_tree, lambda t: asked.append(8 + t) or [(0, 1)])
    assert asked[4:] == [9] and taste.model.thetas is not None and not taste.idle   # 5 of 10 seen: asked, answered
    assert ex.tolist() == [True, False, False, False]                            # tree 8 came before the model
