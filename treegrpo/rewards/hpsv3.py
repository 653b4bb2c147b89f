"""``hpsv3``: HPSv3 (Ma et al. 2025), a human-preference score from Qwen2-VL-7B with a reward head, loaded with
``transformers`` from the user's files. The package ``hpsv3`` pins ``transformers==4.45.2`` and cannot live in
ComfyUI's Python, so its inference is re-implemented here, following MizzenAI/HPSv3's ``hpsv3/inference.py`` and
``Qwen2VLRewardModelBT`` (``hpsv3/model/qwen2vl_trainer.py``, configuration ``HPSv3_7B.yaml``):

* the model: Qwen2-VL-7B-Instruct's architecture, its vocabulary grown by the special token ``<|Reward|>``, and the
  ``ranknet`` head ``Linear(hidden, 1024) → ReLU → Dropout → Linear(1024, 16) → ReLU → Linear(16, 2)`` run in float32
  on the last hidden states; all weights come from ``HPSv3.safetensors`` (the base model's own weights are not
  needed, only its config and processor files);
* the input: one user turn of the chat template holding the image, resized to exactly 256·28·28 pixels (the
  reference sets min_pixels = max_pixels), and the text :data:`INSTRUCTION` with the prompt, followed by
  :data:`REWARD_PROMPT`; the assistant's turn opened (``add_generation_prompt``);
* the score: the head's two outputs at the ``<|Reward|>`` token are (μ, σ) of the preference; the reward is μ.

Where this differs: images come as tensors and are converted to 8-bit PIL images before the processor (the reference
reads files); padding is on the right as in the reference (the pooled position is the special token, so padding does
not move it); ``HPSv3.safetensors`` written with transformers 4.x key names (``model.layers…``, ``visual…``) is
mapped onto the newer layout (``model.language_model…``, ``model.visual…``) and the other way round.
"""
from __future__ import annotations

import os
import re

import torch
from torch import nn

from .base import register
from .torch_reward import TorchReward, files_error, folder_of
from .vlm_judge import chat_inputs, set_pixels, vision_features

INSTRUCTION = ("\nYou are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give "
               "a overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being "
               "the worst and 10 being the best.\n\nTextual prompt - {text_prompt}\n\n\n")
REWARD_PROMPT = "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
REWARD_TOKEN = "<|Reward|>"
PIXELS = 256 * 28 * 28
WEIGHTS = "HPSv3.safetensors"


def ranknet_head(hidden: int, out: int = 2) -> nn.Sequential:
    """HPSv3's reward head (the ``ranknet`` default of ``Qwen2VLRewardModelBT``); its keys are ``rm_head.0`` …
    ``rm_head.5`` as in the published file."""
    return nn.Sequential(nn.Linear(hidden, 1024), nn.ReLU(), nn.Dropout(0.05), nn.Linear(1024, 16), nn.ReLU(),
                         nn.Linear(16, out))


class HPSv3Net(nn.Module):
    """The Qwen2-VL backbone and the reward head, one module (for offloading and a memory manager)."""

    def __init__(self, vlm: nn.Module, hidden: int):
        super().__init__()
        self.vlm = vlm
        self.rm_head = ranknet_head(hidden)

    def forward(self, reward_token_id: int, **inputs) -> torch.Tensor:
        """(B, 2): (μ, σ) at each row's ``<|Reward|>`` token."""
        hidden = self.vlm.model(**inputs).last_hidden_state                       # (B, L, D)
        at = inputs["input_ids"] == reward_token_id
        if not bool((at.sum(1) == 1).all()):
            raise ValueError(f"hpsv3: every input must hold the token {REWARD_TOKEN} exactly once")
        return self.rm_head(hidden[at].float())


def convert_keys(state: dict, expected: set) -> dict:
    """``HPSv3.safetensors``'s keys onto the module's: its ``model.`` / ``visual.`` / ``lm_head.`` prefixes under
    ``vlm.``, the transformers 4.x layout (``model.layers…``, ``visual…``) moved to the newer one
    (``model.language_model.layers…``, ``model.visual…``) when the module has that layout."""
    newer = any(k.startswith("vlm.model.language_model.") for k in expected)
    out = {}
    for k, v in state.items():
        if k.startswith("rm_head."):
            out[k] = v
            continue
        if newer:
            k = re.sub(r"^visual\.", "model.visual.", k)
            k = re.sub(r"^model\.(?!language_model\.|visual\.)", "model.language_model.", k)
        else:
            k = re.sub(r"^model\.visual\.", "visual.", k)
            k = re.sub(r"^model\.language_model\.", "model.", k)
        out["vlm." + k] = v
    return out


@register("hpsv3")
class HPSv3(TorchReward):
    """Reward = HPSv3's preference score μ of the image for its prompt (see the module)."""

    name = "hpsv3"
    is_folder = True
    expected_files = (f"a folder with {WEIGHTS} and Qwen2-VL-7B-Instruct's config and processor files (config.json, "
                      "tokenizer.json or vocab.json + merges.txt, tokenizer_config.json, preprocessor_config.json, "
                      "the chat template); the base model's own weights are not needed")
    source = (f"{WEIGHTS}: MizzenAI/HPSv3 on Hugging Face (project github MizzenAI/HPSv3); the config and processor: "
              "Qwen/Qwen2-VL-7B-Instruct on Hugging Face")
    licence = "see the source (HPSv3: MizzenAI/HPSv3; Qwen2-VL-7B-Instruct: Apache-2.0)"

    def __init__(self, path=None, device="cpu", *, dtype=None, batch_size: int = 2):
        import transformers

        from .torch_reward import empty_init
        from .weightfiles import read_weights

        if dtype is None and torch.device(device).type == "cuda":
            dtype = "bfloat16"
        self._setup(device, dtype, batch_size)
        folder = folder_of(path, self.name, self.expected_files, self.source)
        weights = os.path.join(folder, WEIGHTS)
        missing = [f for f in ("config.json", WEIGHTS) if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            raise files_error(self.name, f"{folder} lacks {', '.join(missing)}", self.expected_files, self.source)
        config = transformers.AutoConfig.from_pretrained(folder)
        if type(config).__name__ != "Qwen2VLConfig":
            raise ValueError(f"{self.name}: {folder}/config.json describes a {type(config).__name__}; HPSv3 is built "
                             "on Qwen2-VL-7B-Instruct: use that model's config.json")
        try:
            self.processor = transformers.AutoProcessor.from_pretrained(folder)
        except (OSError, ValueError, TypeError) as e:
            raise files_error(self.name, f"the processor files in {folder} cannot be read ({e})", self.expected_files,
                              self.source) from None
        tok = self.processor.tokenizer
        if REWARD_TOKEN not in tok.get_vocab():
            tok.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
        self.processor.tokenizer.padding_side = "right"
        ip = self.processor.image_processor
        set_pixels(ip, lo=PIXELS, hi=PIXELS, exact=True)     # the reference: min_pixels = max_pixels
        self.reward_token_id = int(tok.convert_tokens_to_ids(REWARD_TOKEN))
        state = read_weights(weights, self.name)      # an incomplete file or a web page says so
        rows = next((v.shape[0] for k, v in state.items() if k.endswith("embed_tokens.weight")), None)
        if rows is None:
            raise ValueError(f"{self.name}: {weights} holds no token embeddings; it is not an HPSv3 checkpoint")
        if rows <= self.reward_token_id:
            raise ValueError(f"{self.name}: {weights} has {rows} token embeddings, but {REWARD_TOKEN} is token "
                             f"{self.reward_token_id} of the tokenizer in {folder}: use Qwen2-VL-7B-Instruct's files")
        text = getattr(config, "text_config", config)
        text.vocab_size = rows                       # the vocabulary grown by <|Reward|>, as the file holds it
        with empty_init():
            net = HPSv3Net(transformers.Qwen2VLForConditionalGeneration(config), text.hidden_size)
        state = convert_keys(state, set(net.state_dict()))
        absent = sorted(set(net.state_dict()) - set(state))
        extra = sorted(set(state) - set(net.state_dict()))
        if absent or extra:
            raise ValueError(f"{self.name}: {weights} does not fit Qwen2-VL with the HPSv3 head (missing "
                             f"{absent[:4]}{' …' if len(absent) > 4 else ''}, unexpected {extra[:4]}"
                             f"{' …' if len(extra) > 4 else ''}); it is not an HPSv3 checkpoint for this config")
        want = net.state_dict()
        shaped = [k for k in sorted(state) if tuple(state[k].shape) != tuple(want[k].shape)]
        if shaped:      # e.g. Qwen2-VL-2B's config (a vlm_judge folder's) beside the 7B HPSv3 weights
            k = shaped[0]
            raise ValueError(f"{self.name}: {weights} does not fit the config.json in {folder} ({len(shaped)} tensors "
                             f"of other shapes, e.g. {k}: {tuple(state[k].shape)} in the file, "
                             f"{tuple(want[k].shape)} by the config): put Qwen2-VL-7B-Instruct's config and processor "
                             "files beside HPSv3.safetensors")
        net.load_state_dict(state, strict=True, assign=True)
        self.module = net
        self._finish()

    def _keep_fp32(self) -> None:
        self.module.rm_head.float()            # the reference runs its head in float32

    def chats(self, prompts: list[str]) -> list[list[dict]]:
        """One user turn per prompt: the image, then the instruction with the prompt and the reward token."""
        return [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": INSTRUCTION.format(
            text_prompt=p) + REWARD_PROMPT}]}] for p in prompts]

    def inputs(self, images: torch.Tensor, prompts: list[str]) -> dict:
        return chat_inputs(self.processor, self.chats(prompts), images, self.device, self.dtype)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """(B,) μ for images (B, 3, H, W) in [0, 1]."""
        return self.module(self.reward_token_id, **self.inputs(images, prompts))[:, 0]

    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D) its vision tower's features (:func:`treegrpo.rewards.vlm_judge.vision_features`)."""
        return vision_features(self.module.vlm, self.inputs(images, [""] * images.shape[0]))
