"""Picks become rewards (treegrpo/artist/answers.py): the pairwise wins each kind of answer implies and the within-tree win
rates, on hand-worked trees; answers that carry no preference; bad answers refused with what is wrong."""
import pytest
import torch

from treegrpo.artist.answers import Answer, answer_rewards, pairwise_wins


def rates(answer, n):
    r = answer_rewards(answer, n)
    return None if r is None else [round(float(v), 4) for v in r]


def test_one_favourite_beats_every_other_leaf():
    a = Answer("favourites", good=(1,))
    assert sorted(pairwise_wins(a, 4)) == [(1, 0), (1, 2), (1, 3)]
    assert rates(a, 4) == [0.0, 1.0, 0.0, 0.0]


def test_favourites_and_bad_leaves():
    # 0 good, 3 bad: 0>1, 0>2, 0>3, 1>3, 2>3 → 0: 3/3, 1: 1/2, 2: 1/2, 3: 0/3
    a = Answer("favourites", good=(0,), bad=(3,))
    assert sorted(pairwise_wins(a, 4)) == [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]
    assert rates(a, 4) == [1.0, 0.5, 0.5, 0.0]
    # two favourites tie with each other and beat the rest
    assert rates(Answer("favourites", good=(0, 2)), 4) == [1.0, 0.0, 1.0, 0.0]
    # only a bad leaf marked: everything else beats it
    assert rates(Answer("favourites", bad=(2,)), 3) == [1.0, 1.0, 0.0]


def test_a_ranking_gives_all_its_pairs_and_ties_give_none():
    full = Answer("ranking", ranking=((3,), (1,), (0,), (2,)))
    assert len(pairwise_wins(full, 4)) == 6
    assert rates(full, 4) == [0.3333, 0.6667, 0.0, 1.0]
    tiers = Answer("ranking", ranking=((2,), (0, 1), (3,)))   # 0 and 1 tie: no pair between them
    assert sorted(pairwise_wins(tiers, 4)) == [(0, 3), (1, 3), (2, 0), (2, 1), (2, 3)]
    assert rates(tiers, 4) == [0.5, 0.5, 1.0, 0.0]


def test_best_and_worst():
    # 1 best, 2 worst: 1>0, 1>2, 1>3, 0>2, 3>2 → 0: 1/2, 1: 3/3, 2: 0/3, 3: 1/2
    a = Answer("best_worst", best=1, worst=2)
    assert sorted(pairwise_wins(a, 4)) == [(0, 2), (1, 0), (1, 2), (1, 3), (3, 2)]
    assert rates(a, 4) == [0.5, 1.0, 0.0, 0.5]


def test_one_leaf_picked_of_two_and_answers_without_preference():
    assert rates(Answer("favourites", good=(0,)), 2) == [1.0, 0.0]
    assert rates(Answer("none"), 4) is None and rates(Answer("skip"), 4) is None


@pytest.mark.parametrize("answer,n,match", [
    (Answer("favourites", good=(4,)), 4, "leaf 4 is not in this tree"),
    (Answer("favourites", good=(1,), bad=(1,)), 4, "both good and bad"),
    (Answer("favourites"), 4, "pick at least one"),
    (Answer("best_worst", best=1, worst=1), 4, "the same"),
    (Answer("best_worst", best=1), 4, "both the best and the worst"),
    (Answer("ranking", ranking=((0, 1),)), 2, "at least two tiers"),
    (Answer("ranking", ranking=((0,), (0,))), 2, "appears twice"),
    (Answer("vote"), 4, "not one of"),
    (Answer("favourites", good=(0,)), 1, "at least 2 leaves"),
])
def test_bad_answers_are_refused_naming_what_is_wrong(answer, n, match):
    with pytest.raises(ValueError, match=match):
        pairwise_wins(answer, n)


def test_the_dialogs_json_round_trips_and_junk_is_refused():
    a = Answer.from_dict({"mode": "ranking", "ranking": [[2], [0, 1], [3]], "seconds": 4.5})
    assert a.ranking == ((2,), (0, 1), (3,)) and Answer.from_dict(a.to_dict()) == a
    for bad, match in (([1], "JSON object"), ({"mode": "none", "colour": 1}, "unknown fields"),
                       ({"mode": "none", "seconds": -1}, "not a duration")):
        with pytest.raises(ValueError, match=match):
            Answer.from_dict(bad)
    assert torch.is_tensor(answer_rewards(Answer.from_dict({"mode": "favourites", "good": [0]}), 3))


def test_the_artist_settings_are_identifiers_and_read_the_nodes_labels():
    """ArtistConfig's choices are identifiers; the nodes show labels (the text saved workflows keep), which the config
    reads as the values they stand for; anything else is refused naming the choices."""
    import pytest

    from treegrpo.config import ArtistConfig, ConfigError, field_labels

    assert ArtistConfig().ask == "every" and ArtistConfig().on_timeout == "skip"
    assert ArtistConfig(ask="when unsure").ask == ArtistConfig(ask="unsure").ask == "unsure"
    assert ArtistConfig(on_timeout="use the reward model").on_timeout == "reward_model"
    assert field_labels(ArtistConfig, "ask") == {"every": "every N-th tree", "unsure": "when unsure"}
    with pytest.raises(ConfigError, match=r"ArtistConfig\.ask.*unsure"):
        ArtistConfig(ask="sometimes")
