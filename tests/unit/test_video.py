"""Videos for image rewards (treegrpo/video.py): frame choice, the causal latent prefix, rewards averaged over
frames, and the Trainer scoring video leaves by that mean."""
import pytest
import torch

from treegrpo.config import ConfigError, TrainConfig, VideoConfig
from treegrpo.video import (first_frames, frame_indices, group_frames, latent_frames_for, latent_prefix,
                            score_over_frames, video_length)


def test_lengths_follow_comfyui_empty_video_latents():
    # EmptyHunyuanLatentVideo / EmptyWanLatentVideo: ((length - 1) // 4) + 1 latent frames
    for frames in (1, 5, 9, 33, 81):
        t = latent_frames_for(frames, 4)
        assert t == (frames - 1) // 4 + 1
        assert video_length(t, 4) == frames
    assert latent_frames_for(7, 4) == 2 and video_length(2, 4) == 5
    with pytest.raises(ValueError, match="frames must be >= 1"):
        latent_frames_for(0, 4)


def test_frame_indices_and_the_latent_prefix_that_decodes_them():
    assert frame_indices(33, 4, 4) == [0, 4, 8, 12]
    assert frame_indices(9, 4, 4) == [0, 4, 8]           # a short video gives what it has
    assert frame_indices(1, 4, 4) == [0]
    # pixel frame f lies in latent frame ceil(f / tc): frames 0..12 need latent frames 0..3
    assert latent_prefix([0, 4, 8, 12], 4) == 4
    assert latent_prefix([0], 4) == 1
    assert latent_prefix([0, 5], 4) == 3                  # frame 5 is in latent frame 2
    for idx in ([0, 3], [0, 4, 8], [0, 6, 12, 18]):
        m = latent_prefix(idx, 4)
        assert video_length(m, 4) > max(idx) >= video_length(m - 1, 4) if m > 1 else max(idx) == 0
    with pytest.raises(ValueError, match="reward_frames and frame_stride"):
        frame_indices(9, 0, 4)


def test_rewards_over_frames_are_the_mean_of_each_videos_frames():
    g = torch.Generator().manual_seed(0)
    videos = torch.rand(3, 4, 3, 8, 8, generator=g)
    calls = []

    def reward(images, prompts):
        calls.append((images.shape[0], list(prompts)))
        return images.mean(dim=(1, 2, 3)) + torch.tensor([len(p) for p in prompts], dtype=torch.float32)

    out = score_over_frames(reward, videos, ["a", "bb", "ccc"])
    want = videos.mean(dim=(2, 3, 4)).mean(1) + torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(out, want, atol=1e-6)
    assert calls == [(12, ["a"] * 4 + ["bb"] * 4 + ["ccc"] * 4)]           # one call, each frame with its prompt
    images = videos[:, 0]
    assert torch.equal(score_over_frames(reward, images, ["a", "bb", "ccc"]), reward(images, ["a", "bb", "ccc"]))
    assert torch.equal(first_frames(videos), images) and first_frames(images) is images


def test_group_frames_reads_a_vaedecode_batch_of_videos():
    frames = torch.arange(2 * 9, dtype=torch.float32).reshape(18, 1, 1, 1).expand(18, 3, 2, 2)
    v = group_frames(frames, 9, 3, 4)
    assert v.shape == (2, 3, 3, 2, 2)
    assert v[:, :, 0, 0, 0].tolist() == [[0, 4, 8], [9, 13, 17]]
    assert group_frames(frames, 1, 3, 4) is frames
    with pytest.raises(ValueError, match="not whole videos"):
        group_frames(frames, 7, 3, 4)


def test_video_config_validates_and_is_a_training_setting():
    with pytest.raises(ConfigError, match="VideoConfig.reward_frames"):
        VideoConfig(reward_frames=0)
    with pytest.raises(ConfigError, match="VideoConfig: unknown field"):
        TrainConfig.from_dict({"prompts": ["a"], "video": {"fps": 8}})
    a = TrainConfig(backend="comfy", prompts=["a"]).training_settings()
    b = TrainConfig(backend="comfy", prompts=["a"], video={"frames": 33}).training_settings()
    assert a != b and b["video"]["frames"] == 33
    # a checkpoint written before the field existed reads as the default
    old = TrainConfig(backend="comfy", prompts=["a"]).to_dict()
    old.pop("video")
    assert TrainConfig.from_dict(old).training_settings() == a


def test_trainer_scores_video_leaves_by_the_mean_over_frames():
    from treegrpo.backends.demo import DemoPolicy
    from treegrpo.trainer import Trainer

    cfg = TrainConfig(prompts=["a red circle"], rewards=[{"name": "r", "weight": 1.0}], iterations=1, prompts_per_iter=1, eval_every=0, checkpoint_every=0,
                      tree={"steps": 4, "window_start": 1, "window_width": 1, "branch": 2})
    seen = []

    def reward(images, prompts):
        seen.append(images.shape)
        return images.mean(dim=(1, 2, 3))

    tr = Trainer(cfg, DemoPolicy.load(), {"r": reward}, progress=False)
    videos = torch.rand(2, 3, 3, 4, 4)
    raw = tr.score_images(videos, ["a", "b"])
    assert seen == [(6, 3, 4, 4)]
    assert torch.allclose(raw["r"], videos.mean(dim=(2, 3, 4)).mean(1))


def test_the_step_graphs_preview_and_monitor_take_a_decoded_videos_every_frame():
    """VAEDecode gives every frame of every leaf's video in order: the Tree Preview and the Run Monitor show each
    leaf by its first frame; a count that is neither the leaves nor whole videos of them is refused naming both; an
    Advantage Backup fed per-frame scores names frames_per_video."""
    from types import SimpleNamespace

    from treegrpo.advantages import RewardError, check_rewards
    from treegrpo.report import tree_preview
    from treegrpo.video import leaf_frames

    frames = torch.rand(18, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    videos, stills = torch.zeros(2, 4, 3, 1, 1), torch.zeros(2, 4, 1, 1)
    assert torch.equal(leaf_frames(frames, videos, "x"), frames[[0, 9]])
    assert torch.equal(leaf_frames(frames[:2], videos, "x"), frames[:2])
    with pytest.raises(ValueError, match="the Tree Preview got 17 images for the tree's 2 leaves .nor 2 whole videos"):
        leaf_frames(frames[:17], videos, "the Tree Preview")
    with pytest.raises(ValueError, match="the Run Monitor got 18 images for the tree's 2 leaves: connect"):
        leaf_frames(frames, stills, "the Run Monitor")        # image leaves: another batch's decode, not frames
    batch = SimpleNamespace(n_trees=1, leaves=videos, advantages=None, branching=[2])
    img = tree_preview(batch, frames)
    assert img.ndim == 4 and img.shape[0] == 1 and img.shape[-1] == 3
    with pytest.raises(RewardError, match="look like 9-frame videos scored frame by frame: set the Reward Scorer's "
                                          "frames_per_video to 9"):
        check_rewards({"clipscore": torch.rand(18)}, 2, frames_hint=True)
    with pytest.raises(RewardError) as e:                  # a reward of the Train node's or the CLI's: no scorer
        check_rewards({"mine": torch.rand(18)}, 2, where=" at iteration 3")
    assert "frames_per_video" not in str(e.value)


def test_a_video_setting_the_vae_cannot_give_is_said():
    """frames not 4k+1 (Wan's VAE), scored frames the stride runs past, only the first frame: each said, with the
    setting that gives what was asked; the shipped workflow's 33 frames, 4 scored 8 apart: nothing to say."""
    from treegrpo.video import video_notes

    assert video_notes(33, 4, 4, 8) == [] and video_notes(1, 4, 4, 4) == []
    short, = video_notes(10, 4, 3, 4)
    assert "leaves are 9 frames long; set frames to 9 or 13" in short
    few, = video_notes(9, 4, 8, 4)
    assert "only 3 such frames (0, 4, 8)" in few and "lower frame_stride to 1" in few
    first, = video_notes(9, 4, 4, 16)
    assert "only its first frame is scored" in first and "lower frame_stride to 2" in first


def test_a_video_sample_is_shown_as_its_scored_frames_side_by_side():
    """frame_strip: (B, F, 3, H, W) → the F frames left to right, 2 white pixels apart; the sample grid sizes such a
    strip by its height (a 4-frame 352-pixel strip is not squeezed to 128 pixels wide)."""
    from treegrpo.report import sample_grid
    from treegrpo.video import frame_strip

    v = torch.rand(2, 4, 3, 8, 10, generator=torch.Generator().manual_seed(0))
    s = frame_strip(v)
    assert s.shape == (2, 3, 8, 4 * 10 + 3 * 2)
    assert torch.equal(s[..., 12:22], v[:, 1]) and torch.all(s[..., 10:12] == 1)
    assert frame_strip(v[:, 0]) is not None and torch.equal(frame_strip(v[:, 0]), v[:, 0])
    strips = torch.rand(2, 3, 352, 4 * 640 + 6)
    g = sample_grid(strips, 2)
    assert g.shape[1] == 2 + 64 + 2 and g.shape[2] > 2 * 400              # frames 64 px tall, one row
