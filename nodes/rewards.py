"""Reward Model Loader and Reward Scorer nodes."""
from __future__ import annotations

import logging

import folder_paths
from comfy_api.latest import io

from treegrpo.comfyui.reward_files import FOLDER, NO_FILE, register_model_folder
from treegrpo.comfyui.runtime import ManagedReward
from treegrpo.rewards.base import (available, load_reward, missing_package, loader_options, options_help,
                                   reward_files_help)
from treegrpo.rewards.scoring import score_images
from treegrpo.rewards.vlm_judge import DEFAULT_QUESTION as VLM_DEFAULT_QUESTION
from treegrpo.video import group_frames

from .sockets import CATEGORY, PackNode, RewardModel, Rewards
from .widgets import config_default, widget

def reward_files() -> list[str]:
    register_model_folder()
    return [NO_FILE] + folder_paths.get_filename_list(FOLDER)


class RewardModelLoader(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPORewardModelLoader", display_name="TreeGRPO Reward Model Loader",
            category=f"{CATEGORY}/rewards",
            description="Loads a reward model from models/reward_models (no downloads).",
            inputs=[
                io.Combo.Input("reward", options=available(), default="demo_adherence",
                               tooltip="reward model type"),
                io.Combo.Input("file", options=reward_files(), default=NO_FILE,
                               tooltip="weight file in models/reward_models (the demo and JPEG rewards need none); "
                                       "for a model folder (PickScore, ImageReward, aesthetic, HPSv3, the VLM "
                                       "judge) any file inside it. The list shows the files that can be the chosen "
                                       "reward. "
                                       "What each reward needs, where it comes from and its licence:\n"
                                       + reward_files_help()),
                io.String.Input("options", default="{}", multiline=True, optional=True,
                                tooltip="the reward's options as JSON, e.g. {\"dtype\": \"bfloat16\", "
                                        "\"batch_size\": 8}. " + options_help()),
                io.ClipVision.Input("clip_vision", optional=True,
                                    tooltip="reward 'taste' learnt on CLIP Vision features: the same CLIP Vision "
                                            "model (Load CLIP Vision) it was learnt with"),
                io.String.Input("question", default="", multiline=True, optional=True,
                                tooltip="reward 'vlm_judge': the yes/no question asked about each image; {prompt} "
                                        "becomes the image's prompt; the reward is P(Yes). Empty: "
                                        + VLM_DEFAULT_QUESTION),
            ],
            outputs=[RewardModel.Output(display_name="reward_model", tooltip="to a Reward Scorer or the Train node")],
        )

    @classmethod
    def validate_inputs(cls, reward=None, options=None, question=None):
        ok = cls.check_choice("reward", reward, available())
        if ok is not True or reward is None:
            return ok
        missing = missing_package(reward)
        if missing:
            return missing
        if options is None:
            return ok
        try:
            loader_options(reward, options, question)
        except ValueError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, reward, file, options="{}", clip_vision=None, question=""):
        opts, notes = loader_options(reward, options, question)
        for note in notes:
            logging.warning("TreeGRPO: %s", note)
        path = None if file == NO_FILE else folder_paths.get_full_path_or_raise(FOLDER, file)
        if reward == "taste":
            from treegrpo.comfyui.artist.taste import taste_reward
            return io.NodeOutput({"name": reward, "model": ManagedReward(taste_reward(path, clip_vision, **opts))})
        return io.NodeOutput({"name": reward, "model": ManagedReward(load_reward(reward, path=path, **opts))})


class RewardScorer(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPORewardScorer", display_name="TreeGRPO Reward Scorer", category=f"{CATEGORY}/rewards",
            description="Scores decoded images against their prompt. Chain scorers to combine several rewards "
                        "with weights.",
            inputs=[
                io.Image.Input("images", tooltip="decoded leaves (VAEDecode of the Tree Sampler's leaves)"),
                RewardModel.Input("reward_model", tooltip="from a TreeGRPO Reward Model Loader"),
                io.String.Input("prompt", default="", multiline=True,
                                tooltip="prompt of the images: one line for all, or one line per image"),
                io.Float.Input("weight", default=1.0, min=0.0, max=100.0, step=0.05,
                               tooltip="weight of this reward in the combination"),
                Rewards.Input("rewards", optional=True, tooltip="rewards from another scorer to combine with"),
                io.Int.Input("frames_per_video", default=1, min=1, max=10000, optional=True,
                             tooltip="video leaves: the frames one decoded video has (VAEDecode gives every video's "
                                     "frames in order); each video gets one reward, the mean over its scored frames. "
                                     "1 = images"),
                widget(io.Int, "reward_frames", min=1, max=1000, optional=True),
                widget(io.Int, "frame_stride", min=1, max=1000, optional=True),
            ],
            outputs=[Rewards.Output(display_name="rewards",
                                     tooltip="per-leaf rewards (this one and the chained ones), for Advantage Backup")],
        )

    @classmethod
    def validate_inputs(cls, prompt=None):
        return cls.check_dependencies()

    @classmethod
    def execute(cls, images, reward_model, prompt, weight, rewards=None, frames_per_video=1, reward_frames=None,
                frame_stride=None):
        videos = group_frames(images.movedim(-1, 1), frames_per_video or 1,
                              reward_frames or config_default("reward_frames"),
                              frame_stride or config_default("frame_stride"))
        out = score_images(reward_model["model"], reward_model["name"], videos, prompt, weight, previous=rewards)
        return io.NodeOutput(out)


NODES = [RewardModelLoader, RewardScorer]
