"""The artist's taste as a reward: a taste model learnt from their picks (treegrpo/artist/taste.py), saved as
``<run_name>_taste.safetensors`` in ``models/reward_models/``, scores images like any other reward model:
``reward = mean over the ensemble of θ·z(features(image))`` (the prompt is not used: a taste is about the images).

``features_path``: the weight files of the reward whose image tower the taste was learnt on (``reward:<name>``
features; default: the path recorded when it was saved); the demo features need no files."""
from __future__ import annotations

import os
from typing import Optional

import torch

from .base import check_batch, register


@register("taste")
class TasteReward:
    name = "taste"
    expected_files = ("<run_name>_taste.safetensors, which a Train node run that asks the artist (artist_ask: when "
                      "unsure) writes into models/reward_models")
    source = "your own answers"
    licence = "yours"

    def __init__(self, path: Optional[str] = None, device="cpu", features_path: Optional[str] = None, _encoder=None):
        from ..artist.taste import TasteModel
        from ..artist.features import feature_encoder

        if not path:
            raise ValueError("reward 'taste' needs the taste model's file (path): <run_name>_taste.safetensors, "
                             "written into models/reward_models/ by a run that asked the artist")
        self.model = TasteModel.load(path)
        self.path = os.fspath(path)
        self.features = self.model.features
        encoder = _encoder      # an encoder already built (ComfyUI's CLIP Vision), else the file's own
        if encoder is None:
            fp = features_path or self.model.info.get("features_path") or None
            encoder = feature_encoder(self.features, fp, device, options=self.model.info.get("features_options"),
                                      dim=self.model.feature_dim)
        self.encoder = encoder
        probe = getattr(encoder, "dim", None)
        if probe is not None and probe != self.model.feature_dim:
            raise ValueError(f"taste model {self.path!r} was learnt on {self.model.feature_dim} features, the "
                             f"{self.features} encoder gives {probe}: it belongs to another encoder")

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        check_batch(images, prompts, self.name)
        return self.model.scores(self.encoder(images.float().clamp(0, 1)))

    def __repr__(self) -> str:
        return f"TasteReward({self.path!r}, features={self.features}, answers={self.model.info.get('answers')})"
