"""Issue 50: the taste model asks where the samples have moved, keeps a floor rate, asks more when it disagrees with
the artist, and warns when it is being fooled (treegrpo/artist/taste.py); the simulated artists' hidden tastes
(treegrpo/demo/tastes.py) on hand-drawn pictures."""
import math

import pytest
import torch

from treegrpo.artist.answers import Answer, pairwise_wins
from treegrpo.demo import tastes
from treegrpo.demo.shapes import BACKGROUND_RGB
from treegrpo.artist.taste import (OnlineTaste, TasteConfig, TasteModel, _spacing, ask_reason, feature_spread,
                            taste_warnings)

SURE = torch.tensor([[5.0, 0.0, -1.0], [6.0, 0.5, -1.0], [4.0, 0.0, 0.0]])
TORN = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.2, 0.0]])


def test_ask_reasons_in_their_order():
    cfg = TasteConfig(heads=3, warmup_trees=2, confident=0.9, max_ask_rate=0.5, min_ask_rate=0.1, novelty=1.5,
                      agreement_floor=0.6)
    assert ask_reason(SURE, 0, 0, cfg) == "warm-up" and ask_reason(None, 1, 1, cfg) == "warm-up"
    # no model after the warm-up trees (nobody answered with a preference): asked within the cap, not every tree
    assert ask_reason(None, 9, 4, cfg) == "warm-up" and ask_reason(None, 9, 5, cfg) is None
    assert ask_reason(SURE, 9, 9, cfg, warned=True) == "warning"            # a warning overrides the cap
    assert ask_reason(SURE, 19, 1, cfg) == "floor"                           # 1 answer < 0.1 × 20 trees
    assert ask_reason(SURE, 19, 2, cfg) is None                              # floor met, sure, near, agreeing
    assert ask_reason(TORN, 19, 2, cfg) == "unsure"
    assert ask_reason(SURE, 19, 2, cfg, novelty=1.6) == "moved"
    assert ask_reason(SURE, 19, 2, cfg, novelty=1.4) is None
    assert ask_reason(SURE, 19, 2, cfg, agreement=0.5) == "disagrees"
    assert ask_reason(SURE, 19, 2, cfg, agreement=0.7) is None
    # the cap holds for every reason but the warm-up, the warning and the floor: 10 answers of 20 trees
    assert ask_reason(TORN, 19, 10, cfg, novelty=9.0, agreement=0.0) is None
    off = TasteConfig(novelty=0, agreement_floor=0, min_ask_rate=0, warmup_trees=0)
    assert ask_reason(SURE, 19, 0, off, novelty=9.0, agreement=0.0) is None
    for bad, match in [({"novelty": -1}, "novelty"), ({"min_ask_rate": 0.5}, "min_ask_rate"),
                       ({"agreement_floor": 1.5}, "agreement_floor"), ({"recent": 0}, "recent"),
                       ({"diversity_floor": 1.0}, "diversity_floor")]:
        with pytest.raises(ValueError, match=match):
            TasteConfig(**bad)


def test_spacing_and_spread_against_hand_computed_values():
    # trees {0, 1} and {2}: leaves at x = 0, 1 (tree 0) and x = 3 (tree 1); nearest other-tree distances 3, 2, 2
    z = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    assert _spacing(z, [2, 1]) == pytest.approx(2.0)
    assert _spacing(z, [3]) is None
    # three points on a line at 0, 3, 4 in 1-D: pairwise 3, 4, 1 -> mean 8/3 (√D = 1)
    assert feature_spread(torch.tensor([[0.0], [3.0], [4.0]])) == pytest.approx(8 / 3)
    # D = 4: distances scale by 1/√4
    f = torch.zeros(2, 4)
    f[1] = 1.0
    assert feature_spread(f) == pytest.approx(math.sqrt(4) / 2)
    assert feature_spread(torch.zeros(1, 4)) == 0.0


def test_novelty_is_about_one_among_the_answers_and_grows_away_from_them():
    g = torch.Generator().manual_seed(0)
    m = TasteModel(config=TasteConfig(heads=2))
    for _ in range(30):
        f = torch.randn(4, 6, generator=g)
        m.add(f, pairwise_wins(Answer("favourites", good=(int(f[:, 0].argmax()),)), 4), refit=False)
    m.fit()
    near = [m.novelty(torch.randn(4, 6, generator=g)) for _ in range(20)]
    far = [m.novelty(torch.randn(4, 6, generator=g) + 6.0) for _ in range(20)]
    assert 0.5 < sorted(near)[10] < 1.5, near           # the median fresh tree from the same cloud
    assert min(far) > 3 * max(near), (near, far)
    # a model read from a file keeps no leaves: no novelty
    assert TasteModel().novelty(torch.zeros(2, 6)) is None


def _leaves(centre, g, n=4, dim=6):
    return centre + 0.3 * torch.randn(n, dim, generator=g)


def _warmed_up(seed: int, max_ask_rate: float):
    """An OnlineTaste after 8 answered trees (2 a round) of features around the origin, by an artist who prefers the
    largest first feature: (taste, its ask function, the list the next round's features go in, leaf_tree, g)."""
    g = torch.Generator().manual_seed(seed)
    cfg = TasteConfig(heads=3, warmup_trees=8, confident=0.5, max_ask_rate=max_ask_rate, min_ask_rate=0.0,
                      agreement_floor=0.0, diversity_floor=0.0)
    taste = OnlineTaste(TasteModel(config=cfg))
    feats = []

    def ask(t):
        f = feats[t]
        return pairwise_wins(Answer("favourites", good=(int(f[:, 0].argmax()),)), len(f))

    leaf_tree = torch.arange(2).repeat_interleave(4)
    for _ in range(4):
        feats[:] = [torch.randn(4, 6, generator=g) for _ in range(2)]
        taste.round(None, leaf_tree, ask, features=torch.cat(feats))
    return taste, ask, feats, leaf_tree, g


def test_online_taste_asks_where_the_samples_moved():
    """Answers cover a cloud at the origin; the samples then drift away: the heads stay sure (the taste is clear) but
    the drifted trees are asked about ('moved'), trees inside the cloud are not."""
    taste, ask, feats, leaf_tree, g = _warmed_up(1, max_ask_rate=1.0)
    feats[:] = [_leaves(torch.zeros(6), g) for _ in range(2)]
    _, _, st = taste.round(None, leaf_tree, ask, features=torch.cat(feats))
    assert st["taste_reasons"].get("moved", 0) == 0
    drift = torch.zeros(6)
    drift[1:] = 8.0                                             # away in the features the taste does not use
    feats[:] = [_leaves(drift, g) for _ in range(2)]
    _, _, st = taste.round(None, leaf_tree, ask, features=torch.cat(feats))
    assert st["taste_reasons"].get("moved", 0) >= 1, st


def test_disagreement_asks_more_and_a_fooled_model_warns_once():
    """After the warm-up the artist's taste flips: the model disagrees with the recent answers, so sure trees are
    asked about ('disagrees'; the floor rate's questions are what reveal the change); with the samples moving towards
    what the model likes, the warning is raised once and the next tree is asked about."""
    g = torch.Generator().manual_seed(2)
    cfg = TasteConfig(heads=3, warmup_trees=6, confident=0.5, max_ask_rate=1.0, min_ask_rate=0.5, novelty=0.0,
                      recent=3, agreement_floor=0.6, diversity_floor=0.0)
    taste = OnlineTaste(TasteModel(config=cfg))
    sign = [1.0]
    feats = []

    def ask(t):
        f = feats[t]
        return pairwise_wins(Answer("favourites", good=(int((sign[0] * f[:, 0]).argmax()),)), len(f))

    leaf_tree = torch.arange(2).repeat_interleave(4)
    for _ in range(3):
        feats[:] = [torch.randn(4, 6, generator=g) for _ in range(2)]
        taste.round(None, leaf_tree, ask, features=torch.cat(feats))
    sign[0] = -1.0                                              # the artist now likes the opposite
    seen_reasons, warnings = {}, []
    for i in range(12):
        feats[:] = [torch.randn(4, 6, generator=g) + torch.tensor([0.4 * i, 0, 0, 0, 0, 0]) for _ in range(2)]
        _, _, st = taste.round(None, leaf_tree, ask, features=torch.cat(feats))
        for k, v in st["taste_reasons"].items():
            seen_reasons[k] = seen_reasons.get(k, 0) + v
        warnings += st["taste_warnings"]
    assert seen_reasons.get("disagrees", 0) + seen_reasons.get("warning", 0) >= 3, seen_reasons
    fooled = [w for w in warnings if "rates the samples higher" in w]
    assert len(fooled) == 1, warnings                          # said once while its cause lasts


def test_taste_warnings_cases():
    cfg = TasteConfig(agreement_floor=0.6, diversity_floor=0.5)
    assert taste_warnings(0.3, 0.8, 1.0, 1.0, cfg) == {}
    assert set(taste_warnings(0.3, 0.4, 1.0, 1.0, cfg)) == {"fooled"}
    assert taste_warnings(-0.3, 0.4, 1.0, 1.0, cfg) == {}              # the score fell: not fooled that way
    w = taste_warnings(None, None, 0.4, 1.0, cfg)
    assert set(w) == {"collapse"} and "40% as diverse" in w["collapse"]
    assert taste_warnings(None, None, 0.4, 1.0, TasteConfig(diversity_floor=0.0)) == {}


def _picture(x0, x1, y0, y1, rgb=(0.9, 0.1, 0.1)):
    img = BACKGROUND_RGB.view(3, 1, 1).repeat(1, 16, 16).clone()
    img[:, y0:y1, x0:x1] = torch.tensor(rgb).view(3, 1, 1)
    return img.unsqueeze(0)


def test_tastes_on_hand_drawn_pictures():
    empty = BACKGROUND_RGB.view(1, 3, 1, 1).repeat(1, 1, 16, 16)
    for name, f in tastes.TASTES.items():
        assert float(f(empty)) == 0.0, name                   # nothing drawn is worth nothing to every taste
        assert float(f(_picture(0, 1, 0, 1))) == 0.0, name    # one pixel: 1/256 < MIN_AREA
    left_block = _picture(0, 4, 0, 16)                         # columns 0..3: centroid x = 2/16
    assert float(tastes.left(left_block)) == pytest.approx(1 - 2 / 16)
    assert float(tastes.right(left_block)) == pytest.approx(2 / 16)
    assert float(tastes.up(_picture(0, 16, 0, 4))) == pytest.approx(1 - 2 / 16)
    assert float(tastes.big(left_block)) == pytest.approx(0.25)
    assert float(tastes.small(left_block)) == pytest.approx(1 - 0.25 / 0.5)
    assert float(tastes.small(_picture(0, 4, 0, 2))) == pytest.approx((1 - 8 / 256 / 0.5) * (8 / 256 / 0.06))
    assert float(tastes.warm(left_block)) == pytest.approx(0.5)             # pure red: 20° from the liked hue
    # an orange-red at exactly 20°: r = 1, b = 0, g = 1/3 -> hue 60° × (1/3) = 20°
    assert float(tastes.warm(_picture(0, 8, 0, 8, (1.0, 1 / 3, 0.0)))) == pytest.approx(1.0, abs=1e-5)
    assert float(tastes.warm(_picture(0, 8, 0, 8, (0.1, 0.1, 0.9)))) == 0.0  # blue is not a red
    # cool: a crimson at exactly −20°: r = 1, g = 0, b = 1/3 -> hue 360° − 20° = 340° (−20°); pure red 20° from it
    assert float(tastes.cool(_picture(0, 8, 0, 8, (1.0, 0.0, 1 / 3)))) == pytest.approx(1.0, abs=1e-5)
    assert float(tastes.cool(left_block)) == pytest.approx(0.5)
    assert float(tastes.cool(_picture(0, 8, 0, 8, (1.0, 1 / 3, 0.0)))) == 0.0   # the warm red is 40° away
    # a shape fading into the background is worth less to every taste: clarity = min(1, distance / 0.5)
    faint = _picture(0, 4, 0, 16, rgb=(0.45, 0.2, 0.2))          # 0.25 from the grey: clarity 0.5
    assert float(tastes.clarity(faint)) == pytest.approx(0.5) and float(tastes.clarity(left_block)) == 1.0
    assert float(tastes.taste("left")(faint)) == pytest.approx(0.5 * float(tastes.left(faint)))
    with pytest.raises(ValueError, match="unknown taste"):
        tastes.taste("pretty")


def test_one_in_n_keeps_the_floor_under_the_cap():
    assert TasteConfig.one_in(4).max_ask_rate == 0.25 and TasteConfig.one_in(4).min_ask_rate == 0.05
    c = TasteConfig.one_in(100)
    assert c.max_ask_rate == c.min_ask_rate == 0.01


def novelty_near_and_far(encoder, size: int = 32, trees: int = 10):
    """A taste model answered on noise pictures (features from ``encoder``): the novelty of more noise pictures and of
    smooth colour ramps (the samples 'moved'), and whether an OnlineTaste round asks about the ramps for that
    reason. Shared by the tests of the ComfyUI features (test_taste_server.py)."""
    g = torch.Generator().manual_seed(7)
    m = TasteModel(config=TasteConfig(heads=2, warmup_trees=0, confident=0.5, max_ask_rate=1.0, min_ask_rate=0.0,
                                      agreement_floor=0.0))
    for _ in range(trees):
        f = encoder(torch.rand(4, 3, size, size, generator=g))
        m.add(f, [(0, 1), (0, 2), (0, 3)], refit=False)
    m.fit()
    near = encoder(torch.rand(4, 3, size, size, generator=g))
    ramp = torch.linspace(0, 1, size).view(1, 1, 1, size)
    colours = torch.rand(4, 3, 1, 1, generator=g)
    far = encoder((colours * ramp).expand(4, 3, size, size).contiguous())
    n_near, n_far = m.novelty(near), m.novelty(far)
    taste = OnlineTaste(m, trees_seen=trees, asked=trees)
    _, _, st = taste.round(None, torch.zeros(4, dtype=torch.long), lambda t: [(0, 1)], features=far)
    return n_near, n_far, st["taste_reasons"]


def test_novelty_on_a_reward_models_image_tower(tmp_path):
    import reward_fixtures as rf

    from treegrpo.rewards.base import load_reward
    from treegrpo.artist.features import feature_encoder

    path, arch = rf.make_hps_file(str(tmp_path))
    enc = feature_encoder("reward:hpsv2", reward=load_reward("hpsv2", path=path, arch=arch))
    near, far, reasons = novelty_near_and_far(enc)
    assert near < 1.5 < far and reasons == {"moved": 1}, (near, far, reasons)


def test_trees_beyond_the_answers_are_not_trained_on_when_no_question_is_left():
    """The rate allows no more questions and the samples have moved far from the answered leaves: the model would be
    extrapolating, so those trees are excluded (weight 0) rather than scored; trees among the answers are scored."""
    taste, ask, feats, leaf_tree, g = _warmed_up(3, max_ask_rate=0.5)
    cfg = taste.model.config
    taste.asked = 100                                           # no question left in the rate
    far = torch.zeros(6)
    far[1:] = 8.0
    feats[:] = [_leaves(torch.zeros(6), g), _leaves(far, g)]
    r, ex, st = taste.round(None, leaf_tree, ask, features=torch.cat(feats))
    assert st["taste_asked"] == 0 and st["taste_beyond"] == 1 and ex.tolist() == [False, True], st
    assert st["taste_novelty"] > cfg.novelty and r[:4].abs().sum() > 0


def test_a_taste_warning_reaches_the_runs_warnings_and_log(tmp_path, caplog):
    """The Train node's taste hook puts its round's statistics in ``batch.stats['taste']``; a warning there becomes
    one of the run's warnings (kept with the iteration) and a log line, as the reward-hacking warnings are."""
    import logging

    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.scores import LeafScores
    from treegrpo.trainer import Trainer

    d = cli.demo_config_dict()
    d.update(iterations=1, eval_every=0, prompts_per_iter=2, output_dir=str(tmp_path), run_name="warned")
    cfg = TrainConfig.from_dict(d)
    policy, _ = load_policy(cfg)
    trainer = Trainer(cfg, policy, {"demo_adherence": lambda im, p: torch.rand(len(p))}, progress=False)
    said = "the samples are 40% as diverse as at the start: asking you about the next tree"

    def hook(ctx, batch, images, raw):
        assert ctx.iteration == 0 and ctx.run_name == "warned" and ctx.trees_before == 0
        return LeafScores({"artist": torch.rand(images.shape[0])}, {"artist": 1.0},
                          stats={"taste_warnings": [said], "taste_asked": 0})

    trainer.leaf_scorer = hook
    with caplog.at_level(logging.WARNING):
        stats = trainer.train_step()
    assert stats["taste_warnings"] == [said] and trainer.warnings == [f"iteration 0: {said}"]
    assert said in caplog.text


def test_a_resumed_taste_model_goes_on_as_if_it_had_not_stopped(tmp_path):
    """What the answers cannot give back (the model is refit from them): its agreement with each answer, the rounds'
    mean features and the warm-up's spread its warnings compare with, the warnings said. An artist's walk: after a
    resume the line lost "taste agrees", and the warnings started from nothing. Kept in the checkpoint (read back
    as the checkpoint is, weights only), the resumed model asks, scores and warns as the one that went on."""
    import copy

    g = torch.Generator().manual_seed(2)
    cfg = TasteConfig(heads=3, warmup_trees=6, confident=0.5, max_ask_rate=1.0, min_ask_rate=0.5, novelty=0.0,
                      recent=3, agreement_floor=0.6, diversity_floor=0.0)
    taste = OnlineTaste(TasteModel(config=cfg))
    sign, feats = [1.0], []

    def ask(t):
        f = feats[t]
        return pairwise_wins(Answer("favourites", good=(int((sign[0] * f[:, 0]).argmax()),)), len(f))

    leaf_tree = torch.arange(2).repeat_interleave(4)
    rounds = [[torch.randn(4, 6, generator=g) + torch.tensor([0.4 * i, 0, 0, 0, 0, 0]) for _ in range(2)]
              for i in range(10)]
    for i in range(5):
        feats[:] = rounds[i]
        taste.round(None, leaf_tree, ask, features=torch.cat(feats))
    sign[0] = -1.0
    torch.save(taste.state_dict(), tmp_path / "kept.pt")
    resumed = OnlineTaste(copy.deepcopy(taste.model), trees_seen=taste.trees_seen, asked=taste.asked)
    resumed.load_state_dict(torch.load(tmp_path / "kept.pt", weights_only=True))
    cold = OnlineTaste(copy.deepcopy(taste.model), trees_seen=taste.trees_seen, asked=taste.asked)
    went_on, again, fresh = [], [], []
    for i in range(5, 10):
        for t, out in ((taste, went_on), (resumed, again), (cold, fresh)):
            feats[:] = rounds[i]
            rewards, exclude, st = t.round(None, leaf_tree, ask, features=torch.cat(feats))
            out.append((rewards.tolist(), exclude.tolist(), {k: v for k, v in st.items() if k != "taste_fit_s"}))
    assert again == went_on
    assert fresh[0][2]["taste_recent_agreement"] is None and went_on[0][2]["taste_recent_agreement"] is not None
