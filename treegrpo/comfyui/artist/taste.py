"""The taste model inside ComfyUI: the Train node asks the artist only where the taste model is unsure
(treegrpo/artist/taste.py), scores the other trees with it, and keeps it as
``models/reward_models/<run_name>_taste.safetensors`` (the Reward Model Loader's ``taste`` reward). Features: a CLIP
Vision model of ComfyUI's ``CLIPVisionLoader``, the image tower of the connected reward model, or the embedded demo's
encoder."""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from ...callbacks import TrainerCallback
from ...artist.taste import OnlineTaste, TasteConfig, TasteModel, from_labels
from ...trainer import TrainingInterrupted


class ClipVisionEncoder:
    """ComfyUI's CLIP_VISION: the unit-normalised projected embedding (``image_embeds``) of images (B, 3, H, W)."""

    name = "clip_vision"

    def __init__(self, clip_vision):
        self.clip_vision = clip_vision

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = self.clip_vision.encode_image(images.movedim(1, -1).float().clamp(0, 1))
        emb = out["image_embeds"] if isinstance(out, dict) else out.image_embeds
        return torch.nn.functional.normalize(emb.float(), dim=-1).cpu()


def choose_encoder(clip_vision=None, rewards: Optional[dict] = None, demo: bool = False):
    """The features the taste model learns on: the CLIP Vision input if connected, else the image tower of a
    connected CLIP-based reward model, else the demo's encoder for the demo model; else a ValueError saying what
    to connect (before any work)."""
    from ...artist.features import TOWER_REWARDS, DemoEncoder, RewardTower

    if clip_vision is not None:
        return ClipVisionEncoder(clip_vision)
    for name, model in (rewards or {}).items():
        inner = getattr(model, "reward", model)            # ComfyUI's ManagedReward wraps the reward model
        if name in TOWER_REWARDS and hasattr(inner, "image_features"):
            return RewardTower(inner)
    if demo:
        return DemoEncoder()
    raise ValueError("artist_ask 'when unsure' learns your taste on image features: connect a CLIP Vision model "
                     "(Load CLIP Vision) to taste_features, or use an HPS v2, PickScore, CLIPScore or LAION aesthetic "
                     f"reward model (connected: {', '.join(rewards or {}) or 'none'})")


def taste_file(run_name: str) -> str:
    """``<reward models folder>/<run_name>_taste.safetensors``: the Reward Model Loader's first folder
    (``models/reward_models``; :func:`treegrpo.comfyui.reward_files.reward_folder`)."""
    from ..reward_files import reward_folder

    return os.path.join(reward_folder(), f"{run_name}_taste.safetensors")


def train_node_taste(encoder, mode: str, timeout_s: float, config: Optional[TasteConfig] = None, *,
                     check_interrupt: Optional[Callable[[], None]] = None, prompt_id: Optional[str] = None,
                     client_id: Optional[str] = None, board=None, away_s: float = 30.0) -> Callable:
    """The Train node's leaf scorer (treegrpo.scores) for ``artist_ask = when unsure``. A resumed run first learns again from
    its ``artist_labels.jsonl``; every answer refits the model and rewrites the taste file (``state["save"]``, also
    after a check's answer the Train node has it learn); the statistics (trees
    asked, answers, agreement of the model with each answer before it learnt from it, refit seconds) go into the
    run's log."""
    from ...artist.answers import pairwise_wins
    from ...scores import LeafScores
    from .questions import BOARD, ask_trees

    from ..runtime import prompt_queued_at

    state: dict = {}
    (board or BOARD).back(client_id, prompt_queued_at())   # whoever queued this run since a tree fell back is here

    def online(ctx) -> OnlineTaste:
        if "taste" not in state:
            model = from_labels(ctx.output_dir, encoder, config, features=encoder.name, iteration=ctx.iteration)
            state["taste"] = OnlineTaste(model, encoder, trees_seen=ctx.trees_before, asked=model.answers)
            if state.get("resumed") is not None:    # its checkpoint's agreements, rounds and warnings
                state["taste"].load_state_dict(state["resumed"])
            state["path"] = taste_file(ctx.run_name)
            # the taste file, rewritten after every answer: a tree's, or a check's (the Train node's learn)
            state["save"] = lambda: state["taste"].model.save(state["path"], extra={
                "run_name": ctx.run_name, "features_path": getattr(encoder, "path", None) or "",
                "features_options": getattr(encoder, "options", {})})
        return state["taste"]

    def ask(ctx, batch, images, raw):
        taste = online(ctx)
        pictures = (images if images.ndim == 4 else images[:, 0]).float().cpu()   # video leaves: the first frame
        leaf_tree = batch.leaf_tree.cpu()

        def one(t):
            got: dict = {}
            ask_trees(batch, pictures.movedim(1, -1), folder=ctx.output_dir, iteration=ctx.iteration,
                      seed=ctx.seed, run_name=ctx.run_name, mode=mode, timeout_s=timeout_s,
                      trees=[t], board=board or BOARD, check_interrupt=check_interrupt, prompt_id=prompt_id,
                      client_id=client_id, answers=got, away_grace_s=away_s,
                      timeout_by="taste model" if taste.model.thetas is not None else "skipped")
            answer = got.get(t)
            return None if answer is None else pairwise_wins(answer, int((leaf_tree == t).sum()))

        def stop_if_idle():   # before the update: this iteration is not counted, the run resumes at it
            if taste.idle:
                raise ArtistAway(
                    f"TreeGRPO {ctx.run_name}: nobody answered the last {taste.unanswered} questions and no answer "
                    "has yet said what you prefer (the taste model needs one), so nothing can be trained until you "
                    f"answer; the run stopped before iteration {ctx.iteration + 1} and is saved. Queue the workflow "
                    "again when you are at the page (it resumes there), or set artist_ask to 'every N-th tree': the "
                    "reward models then score the trees you leave")

        before = taste.model.answers
        rewards, exclude, stats = taste.round(pictures, leaf_tree, lambda t: stop_if_idle() or one(t))
        stop_if_idle()
        if taste.model.answers != before:
            state["save"]()
        return LeafScores({"reward": rewards}, {"reward": 1.0}, exclude,
                          stats={k: v for k, v in stats.items() if v is not None})

    ask.state, ask.online = state, online
    ask.keeper = TasteKeeper(state)
    return ask


class TasteKeeper(TrainerCallback):
    """The taste model's running state in the run's checkpoint (:meth:`OnlineTaste.state_dict`; one of the Train
    node's callbacks): a resumed run keeps the model's agreement with the answers, the rounds its warnings compare
    and the warnings already said, as if it had not stopped; its model is refit from the answers."""

    def __init__(self, state: dict):
        self.state = state

    def state_dict(self, trainer) -> Optional[dict]:
        taste = self.state.get("taste")
        return taste.state_dict() if taste is not None else self.state.get("resumed")

    def load_state_dict(self, trainer, state: dict) -> None:
        self.state["resumed"] = state


class ArtistAway(TrainingInterrupted):
    """The run stopped because nobody answers and nothing can be trained without an answer (a checkpoint of the
    last whole iteration was written first)."""


def taste_reward(path: Optional[str], clip_vision=None, **options):
    """The Reward Model Loader's ``taste``: the file's own encoder, or the connected CLIP Vision for a taste learnt
    on CLIP Vision features (refused, saying what to connect, when they do not match)."""
    from ...rewards.base import load_reward

    if path is None:
        raise ValueError("reward 'taste': pick the taste model's file (<run_name>_taste.safetensors) in 'file'")
    model = TasteModel.load(path)
    if model.features == "clip_vision":
        if clip_vision is None:
            raise ValueError(f"{os.path.basename(path)} was learnt on CLIP Vision features: connect the same CLIP "
                             f"Vision model (Load CLIP Vision) to the loader's clip_vision input")
        return load_reward("taste", path=path, _encoder=ClipVisionEncoder(clip_vision), **options)
    return load_reward("taste", path=path, **options)
