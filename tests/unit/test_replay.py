"""The artist's answers given before a crash (treegrpo.artist.replay): which records count as an answer about the
same tree or check, and when the kept pictures are the tree's (the check's sides, in either order) pictures now."""
import json

import numpy as np
import torch
from PIL import Image

from treegrpo.artist.answers import Answer
from treegrpo.artist.replay import (SAME_PICTURE_LEVELS, answers_given, checks_given, earlier_answer, earlier_check,
                                   same_pictures, to_levels)


def _record(**over):
    rec = {"version": 1, "run_name": "r", "iteration": 3, "seed": 0, "tree": 1, "mode": "favourites",
           "answered_by": "artist", "outcome": "answered", "leaves": ["artist/x/leaf_0.png", "artist/x/leaf_1.png"],
           "answer": Answer("favourites", good=(1,)).to_dict()}
    rec.update(over)
    return rec


def test_only_the_artists_answers_about_this_iteration_of_this_run_count(tmp_path):
    recs = [_record(), _record(tree=2, answer=Answer("none").to_dict(), outcome="none"),
            _record(tree=3, iteration=2), _record(tree=4, run_name="s"), _record(tree=5, seed=1),
            _record(tree=6, mode="ranking"), _record(tree=7, answered_by="reward model", answer=None),
            _record(tree=8, answered_by="skipped", answer=None), _record(tree=9, answer={"mode": "favourites",
                                                                                         "oops": 1}),
            _record(tree=1, answer=Answer("favourites", good=(0,)).to_dict())]       # asked again: the newest
    path = tmp_path / "artist_labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"tree": 1, "cut')
    given = answers_given(str(path), run_name="r", iteration=3, seed=0, mode="favourites")
    assert sorted(given) == [1, 2]                           # "no preference" is an answer too
    assert given[1][1] == Answer("favourites", good=(0,)) and given[2][1].mode == "none"
    assert answers_given(str(tmp_path / "none.jsonl"), run_name="r", iteration=3, seed=0, mode="favourites") == {}


def test_the_kept_pictures_are_the_trees_pictures_within_a_level(tmp_path):
    g = torch.Generator().manual_seed(0)
    leaves = [torch.rand(8, 8, 3, generator=g) for _ in range(2)]
    kept = []
    for i, img in enumerate(leaves):
        (tmp_path / "artist" / "x").mkdir(parents=True, exist_ok=True)
        Image.fromarray(to_levels(img).numpy()).save(tmp_path / "artist" / "x" / f"leaf_{i}.png")
        kept.append(f"artist/x/leaf_{i}.png")
    assert same_pictures(str(tmp_path), kept, leaves)
    nudged = [(img + 0.8 * SAME_PICTURE_LEVELS / 255).clamp(0, 1) for img in leaves]   # a GPU's rounding
    assert same_pictures(str(tmp_path), kept, nudged)
    other = [torch.rand(8, 8, 3, generator=g) for _ in range(2)]                        # other noises
    assert not same_pictures(str(tmp_path), kept, [leaves[0], other[1]])
    assert not same_pictures(str(tmp_path), kept, leaves[:1])                           # another tree shape
    assert not same_pictures(str(tmp_path), kept, [leaves[0], torch.rand(4, 4, 3)])     # another size
    assert not same_pictures(str(tmp_path), ["artist/x/leaf_0.png", "artist/x/gone.png"], leaves)
    given = {1: (_record(leaves=kept), Answer("favourites", good=(1,)))}
    assert earlier_answer(given, str(tmp_path), 1, leaves)[1] == Answer("favourites", good=(1,))
    assert earlier_answer(given, str(tmp_path), 1, other) is None
    assert earlier_answer(given, str(tmp_path), 2, leaves) is None
    assert np.asarray(Image.open(tmp_path / kept[0])).dtype == np.uint8


def _check(**over):
    rec = {"version": 1, "prompt_id": "before", "run_name": "r", "iteration": 4, "again": False, "outcome": "answered",
           "pick": 1, "sides": ["artist/c/side_0.png", "artist/c/side_1.png"], "answer": {"mode": "favourites"}}
    rec.update(over)
    return rec


def test_a_check_answered_by_an_earlier_prompt_about_the_same_look_is_used_in_the_order_shown_now(tmp_path):
    recs = [_check(pick=0), _check(iteration=3), _check(again=True), _check(run_name="s"),
            _check(prompt_id="now"), _check(outcome="timeout", answer=None, pick=None), _check(pick=2),
            _check(sides=["artist/c/side_0.png"]), _check(pick=None)]
    path = tmp_path / "artist_checks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"iteration": 4, "cut')
    given = checks_given(str(path), run_name="r", iteration=4, again=False, prompt_id="now")
    assert [r["pick"] for r in given] == [None, 0]       # newest first; a timeout, this prompt's own: not answers
    assert [r["again"] for r in checks_given(str(path), run_name="r", iteration=4, again=True,
                                             prompt_id="now")] == [True]
    assert checks_given(str(tmp_path / "none.jsonl"), run_name="r", iteration=4, again=False, prompt_id="x") == []
    g = torch.Generator().manual_seed(1)
    sides = [torch.rand(6, 10, 3, generator=g) for _ in range(2)]
    (tmp_path / "artist" / "c").mkdir(parents=True)
    for i, side in enumerate(sides):
        Image.fromarray(to_levels(side).numpy()).save(tmp_path / "artist" / "c" / f"side_{i}.png")
    picked = [_check(pick=1)]
    assert earlier_check(picked, str(tmp_path), sides) == (picked[0], 1)            # the same order: its pick
    assert earlier_check(picked, str(tmp_path), sides[::-1]) == (picked[0], 0)      # drawn the other way round
    assert earlier_check([_check(pick=None)], str(tmp_path), sides[::-1])[1] is None   # no preference stays
    assert earlier_check(picked, str(tmp_path), [sides[0], torch.rand(6, 10, 3, generator=g)]) is None
    near = (sides[0] + 0.5 / 255).clamp(0, 1)          # two sides within a level of each other: the nearer order
    for i, side in enumerate((sides[0], near)):
        Image.fromarray(to_levels(side).numpy()).save(tmp_path / "artist" / "c" / f"side_{i}.png")
    assert earlier_check(picked, str(tmp_path), [near, sides[0]]) == (picked[0], 0)
    assert earlier_check(picked, str(tmp_path), [sides[0], near]) == (picked[0], 1)
