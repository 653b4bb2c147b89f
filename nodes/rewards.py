"""Reward Model Loader and Reward Scorer nodes."""
from __future__ import annotations

import os

import folder_paths
from comfy_api.latest import io

from treegrpo.comfyui.session import ManagedReward
from treegrpo.rewards.base import available, load_reward
from treegrpo.rewards.scoring import score_images

from .sockets import CATEGORY, PackNode, RewardModel, Rewards

FOLDER = "reward_models"
NO_FILE = "(none: built-in weights or none needed)"


def register_model_folder() -> None:
    """Register ``models/reward_models`` with ComfyUI's folder_paths (files and model folders)."""
    if FOLDER not in folder_paths.folder_names_and_paths:
        folder_paths.add_model_folder_path(FOLDER, os.path.join(folder_paths.models_dir, FOLDER))


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
                               tooltip="weight file in models/reward_models (the demo and JPEG rewards need none)"),
            ],
            outputs=[RewardModel.Output(display_name="reward_model", tooltip="to a Reward Scorer or the Train node")],
        )

    @classmethod
    def validate_inputs(cls, reward=None):
        return cls.check_choice("reward", reward, available())

    @classmethod
    def execute(cls, reward, file):
        path = None if file == NO_FILE else folder_paths.get_full_path_or_raise(FOLDER, file)
        return io.NodeOutput({"name": reward, "model": ManagedReward(load_reward(reward, path=path))})


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
            ],
            outputs=[Rewards.Output(display_name="rewards",
                                     tooltip="per-leaf rewards (this one and the chained ones), for Advantage Backup")],
        )

    @classmethod
    def validate_inputs(cls, prompt=None):
        return cls.check_dependencies()

    @classmethod
    def execute(cls, images, reward_model, prompt, weight, rewards=None):
        out = score_images(reward_model["model"], reward_model["name"], images.movedim(-1, 1), prompt, weight,
                           previous=rewards)
        return io.NodeOutput(out)


NODES = [RewardModelLoader, RewardScorer]
