"""Prompt files, the held-out split, the text rewards read, and the per-iteration console line (pure functions)."""
import json

import pytest

from treegrpo.progress import IterationClock, format_duration, iteration_line
from treegrpo.prompts import PromptFileError, read_prompt_file, reward_text, split_heldout


@pytest.mark.parametrize("prompt,want", [
    ("a (red:1.2) circle", "a red circle"),
    ("((masterpiece)), a cat, embedding:EasyNegative", "masterpiece, a cat"),
    ("a \\(literal\\) sign", "a (literal) sign"),
    ("a ((big:1.1) dog:0.9) here", "a big dog here"),
    ("(a cat:1.2), (embedding:foo:0.8)", "a cat"),
    ('a sign that says "OPEN"', 'a sign that says "OPEN"'),
    ("plain  prompt , as typed", "plain  prompt , as typed"),     # no syntax: unchanged, byte for byte
])
def test_reward_text_strips_weighting_and_embeddings(prompt, want):
    assert reward_text(prompt) == want


def test_prompt_files_in_three_formats(tmp_path):
    (tmp_path / "a.txt").write_text("one\n\n two  words \n")
    (tmp_path / "b.csv").write_text("caption,other\n\"x, y\",1\nz,2\n")
    (tmp_path / "c.csv").write_text("first\n\"second, quoted\"\n")          # no header: one prompt a row
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "p1"}) + "\n" + json.dumps("p2") + "\n")
    assert read_prompt_file(str(tmp_path / "a.txt")) == ["one", "two words"]
    # "# " lines are comments, as in sd-scripts' prompt files; a hashtag starts a prompt; .csv / .jsonl keep theirs
    (tmp_path / "commented.txt").write_text("# cats\n  #\na cat\n#sunset, beach\n\t# dogs, later\n")
    assert read_prompt_file(str(tmp_path / "commented.txt")) == ["a cat", "#sunset, beach"]
    (tmp_path / "commented.csv").write_text("prompt\n# not a comment\n")
    assert read_prompt_file(str(tmp_path / "commented.csv")) == ["# not a comment"]
    assert read_prompt_file(str(tmp_path / "b.csv")) == ["x, y", "z"]
    assert read_prompt_file(str(tmp_path / "c.csv")) == ["first", "second, quoted"]
    assert read_prompt_file(str(tmp_path / "d.jsonl")) == ["p1", "p2"]
    for name, text, match in [("e.txt", "", "holds no prompts"), ("f.jsonl", '{"x": 1}\n', 'line 1: an object'),
                              ("g.md", "x", "use a .txt"), ("h.txt", "a\x00b", "binary"),
                              # a comma or a quote in an unquoted CSV prompt cut it silently (to "a cat", to
                              # "OPEN written on a shop door": the ocr reward then refused its missing quotes)
                              ("i.csv", "a cat, studio lighting, 4k\n", "line 1: 3 fields where the file has no header"),
                              ("j.csv", "prompt\nx\na cat, studio lighting\n", "line 3: 2 fields where the header has 1"),
                              ("k.csv", '"OPEN" written on a shop door\n', "line 1: not valid CSV"),
                              ("l.csv", 'prompt\n"a cat\nb\n', "not valid CSV .unexpected end of data")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(PromptFileError, match=match):
            read_prompt_file(str(tmp_path / name))
    with pytest.raises(PromptFileError, match="does not exist"):
        read_prompt_file(str(tmp_path / "missing.txt"))
    (tmp_path / "big.txt").write_text("p\n" * 11)
    with pytest.raises(PromptFileError, match="more than the 10"):
        read_prompt_file(str(tmp_path / "big.txt"), max_prompts=10)


def test_a_configs_prompts_file_is_read_as_the_prompt_list_reads_it(tmp_path):
    """``TrainConfig.prompts_file`` (the command line's ``--prompts-file``) reads .csv and .jsonl by their format,
    as the Prompt List node does, not line by line; names a shipped set as the node lists it; and refuses a
    malformed file naming the line before any model loads."""
    from treegrpo.config import ConfigError, TrainConfig
    from treegrpo.prompts import SHIPPED_DIR

    files = {"p.csv": 'id,prompt\n1,"a red circle, big"\n2,a blue  square\n',
             "p.jsonl": '{"prompt": "a red circle, big"}\n\n"a blue square"\n',
             "p.txt": "\ufeffa red circle, big\n\n  a blue square \n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        got = TrainConfig(prompts_file=str(tmp_path / name)).load_prompts()
        assert got == ["a red circle, big", "a blue square"] == read_prompt_file(str(tmp_path / name)), (name, got)
    shipped = TrainConfig(prompts_file="treegrpo/text_rendering.txt").load_prompts()
    assert shipped == read_prompt_file(f"{SHIPPED_DIR}/text_rendering.txt") and len(shipped) == 40
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a cat"}\n{"caption": 3}\n')
    with pytest.raises(ConfigError, match=r"TrainConfig\.prompts_file: prompt file .*bad\.jsonl', line 2: an object"):
        TrainConfig(prompts_file=str(tmp_path / "bad.jsonl")).load_prompts()
    with pytest.raises(ConfigError, match="cannot read 'treegrpo/no_such_set.txt'"):
        TrainConfig(prompts_file="treegrpo/no_such_set.txt").load_prompts()


def test_heldout_split_is_seeded_and_disjoint():
    prompts = [f"p{i}" for i in range(20)] + ["p3"]
    train, held = split_heldout(prompts, 5, seed=1)
    assert len(set(held)) == 5 and not set(held) & set(train) and len(train) + held.count("p3") >= 15
    assert split_heldout(prompts, 5, seed=1) == (train, held)
    assert split_heldout(prompts, 0) == (prompts, [])
    with pytest.raises(PromptFileError, match="hold out fewer"):
        split_heldout(prompts, 20)


def test_iteration_line_and_clock():
    clock = IterationClock(window=3)
    for t in (0.0, 10.0, 20.0, 30.0, 40.0):
        clock.tick(t)
    assert clock.s_per_it == pytest.approx(10.0) and clock.left(4, 10) == pytest.approx(60.0)
    line = iteration_line({"iteration": 3, "reward": 0.4312, "kl": 0.0012}, 200, run_name="sd15",
                          last_eval={"iteration": 2, "eval_reward": 0.5, "eval_judge": 0.52}, s_per_it=38.2,
                          left_s=7140)
    assert line == "TreeGRPO sd15: it 4/200 | reward 0.431 | judge 0.520 (it 2) | KL 1.2e-03 | 38.2 s/it | 1h59m left"
    # a taste model's run: what was asked and how the model agrees, not a mix of log-odds and win rates
    taste = {"iteration": 3, "reward": 7.7, "taste_asked": 2, "taste_trees": 8, "taste_recent_agreement": 0.8333}
    assert iteration_line(taste, 200, run_name="t") == "TreeGRPO t: it 4/200 | asked 2/8 trees | taste agrees 83%"
    # trees that moved beyond the answers with no question left in the rate are not trained: said, not hidden
    assert iteration_line(dict(taste, taste_asked=0, taste_beyond=6), 200, run_name="t") == \
        "TreeGRPO t: it 4/200 | asked 0/8 trees | 6 not trained (beyond your answers) | taste agrees 83%"
    assert format_duration(42) == "42s" and format_duration(185) == "3m05s" and format_duration(3 * 86400 + 4 * 3600) \
        == "3d04h"


def test_the_train_nodes_prompt_box_drops_a_pasted_byte_order_mark():
    from treegrpo.comfyui.train_node import prompt_lines

    assert prompt_lines("\ufeffa red circle\r\n\n  a blue square \n\ufeff\n") == ["a red circle", "a blue square"]
