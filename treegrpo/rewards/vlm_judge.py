"""``vlm_judge``: the reward is a sentence. A local vision-language model is asked a yes/no question about each leaf
and the reward is the probability it gives the answer "Yes" (VQAScore, Lin et al. 2024).

The question is the user's (``question``; ``{prompt}`` in it becomes the leaf's prompt), by default
``Does this image show: "{prompt}"? Answer yes or no.``. Each image and its question go through the model's own chat
template as one user turn (the image, then the text) with the assistant's turn opened; the reward is
``softmax(logits)[Yes]`` at the first answer position, over the whole vocabulary, as VQAScore computes it (``answer``
names the token: its first token id is used). A batch is padded on the left so that every row's last position is the
answer position; batching gives the same scores as one image at a time.

Models: the Qwen2-VL and Qwen2.5-VL families of ``transformers`` (``Qwen2VLForConditionalGeneration``,
``Qwen2_5_VLForConditionalGeneration``), a model folder as published (config.json, the weights, the processor
files), in ``models/reward_models/`` or anywhere. bf16 on a GPU by default; moved to the CPU between scorings like the
other rewards. Images are resized by the model's processor (``max_pixels`` caps the pixels per image: fewer visual
tokens, less memory).
"""
from __future__ import annotations

import json
import os
import string
import warnings
from typing import Optional

import torch

from .base import register
from .torch_reward import TorchReward, files_error, folder_of

DEFAULT_QUESTION = 'Does this image show: "{prompt}"? Answer yes or no.'
ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")   # transformers classes


def chat_inputs(processor, chats: list[list[dict]], images: torch.Tensor, device, dtype) -> dict:
    """The processor's tensors for one chat per image (images (B, 3, H, W) in [0, 1], as 8-bit pictures), the
    assistant's turn opened, on ``device`` (pixel values in ``dtype``)."""
    from PIL import Image

    texts = [processor.apply_chat_template(c, add_generation_prompt=True) for c in chats]
    arr = (images.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    enc = processor(text=texts, images=[Image.fromarray(a) for a in arr], padding=True, return_tensors="pt")
    return {k: (v.to(device, dtype) if k == "pixel_values" else v.to(device)) for k, v in enc.items()}


def set_pixels(ip, lo: int | None = None, hi: int | None = None, exact: bool = False) -> None:
    """Bound the pixels per image of a Qwen2-VL image processor (``lo``: at least, ``hi``: at most — the smaller of
    it and the processor's own unless ``exact``), wherever the installed transformers keeps the bounds
    (``min_pixels`` / ``max_pixels``, or ``size``'s ``shortest_edge`` / ``longest_edge``, a dict or an object)."""
    def cap(old, new, keep_smaller):
        if new is None:
            return old
        return min(int(old), new) if (keep_smaller and not exact and old is not None) else new

    for attr, new, smaller in (("min_pixels", lo, False), ("max_pixels", hi, True)):
        if getattr(ip, attr, None) is not None:
            setattr(ip, attr, cap(getattr(ip, attr), new, smaller))
    size = getattr(ip, "size", None)
    for key, new, smaller in (("shortest_edge", lo, False), ("longest_edge", hi, True)):
        if isinstance(size, dict) and size.get(key) is not None:
            size[key] = cap(size[key], new, smaller)
        elif size is not None and not isinstance(size, dict) and getattr(size, key, None) is not None:
            setattr(size, key, cap(getattr(size, key), new, smaller))


def vision_features(model: torch.nn.Module, enc: dict) -> torch.Tensor:
    """(B, D) a Qwen2-VL model's vision tower output (the merged patch tokens) averaged over each image of the
    processor's output ``enc``, unit-normalised: the features a taste model learns on."""
    visual = getattr(model, "visual", None) or model.model.visual
    out = visual(enc["pixel_values"], grid_thw=enc["image_grid_thw"])
    if torch.is_tensor(out):
        tokens = out
    else:       # transformers 5: the merged tokens are the pooler output
        tokens = out.pooler_output if getattr(out, "pooler_output", None) is not None else out[0]
    patches = enc["image_grid_thw"].prod(-1)
    merged = patches // visual.spatial_merge_size ** 2
    counts = (merged if int(merged.sum()) == tokens.shape[0] else patches).tolist()
    feats = torch.stack([t.float().mean(0) for t in torch.split(tokens, counts)])
    return torch.nn.functional.normalize(feats, dim=-1)


def check_question(question, who: str = "vlm_judge") -> Optional[str]:
    """Refuse (ValueError) a question that cannot be filled in with a leaf's prompt: a placeholder other than a plain
    ``{prompt}`` (another name, an attribute or an index such as ``{prompt.upper}`` or ``{prompt[0]}``, which would
    put a method's name or one letter in the question) or an unpaired brace. Returns a warning for a question without
    ``{prompt}`` (it asks the same of every image, so the reward does not follow the prompts), else None."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{who}: question must be a sentence, e.g. {DEFAULT_QUESTION!r}")
    hint = "the only placeholder is {prompt}, as it is; write other braces as {{ and }}"
    try:
        fields = [(name, spec or "") for _, name, spec, _ in string.Formatter().parse(question) if name is not None]
    except ValueError as e:
        raise ValueError(f"{who}: question {question!r} cannot be filled in ({e}); {hint}") from None
    names = [n for n, _ in fields]
    bad = ["{" + n + (":" + spec if spec else "") + "}" for n, spec in fields if n != "prompt" or "{" in spec]
    if bad:
        raise ValueError(f"{who}: question {question!r} cannot be filled in ({bad[0]} is not {{prompt}}); {hint}")
    if not names:
        return (f"{who}: the question {question!r} has no {{prompt}}: it asks the same of every image, so the reward "
                "does not follow the prompts (put {prompt} where the leaf's prompt belongs, if it should)")
    return None


@register("vlm_judge")
class VLMJudge(TorchReward):
    """Reward = P("Yes") a Qwen2-VL / Qwen2.5-VL model gives to a yes/no question about the image (see the module)."""

    name = "vlm_judge"
    is_folder = True
    expected_files = ("a Qwen2-VL or Qwen2.5-VL model folder: config.json, model*.safetensors and the processor files "
                      "(tokenizer.json or vocab.json + merges.txt, tokenizer_config.json, preprocessor_config.json, "
                      "the chat template)")
    source = ("Hugging Face: Qwen/Qwen2-VL-2B-Instruct, Qwen/Qwen2-VL-7B-Instruct, Qwen/Qwen2.5-VL-3B-Instruct or "
              "Qwen/Qwen2.5-VL-7B-Instruct (the whole folder, e.g. huggingface-cli download)")
    licence = "Apache-2.0 (Qwen2-VL 2B/7B, Qwen2.5-VL 7B); Qwen2.5-VL-3B: the Qwen Research licence"

    def __init__(self, path=None, device="cpu", *, question: str = DEFAULT_QUESTION, answer: str = "Yes",
                 dtype=None, batch_size: int = 4, max_pixels: int = 448 * 448):
        import transformers
        from safetensors import SafetensorError

        from .weightfiles import check_folder_weights

        note = check_question(question, self.name)
        if note:
            warnings.warn(note, stacklevel=2)
        if int(max_pixels) < 28 * 28 * 4:
            raise ValueError(f"{self.name}: max_pixels must be at least {28 * 28 * 4} (4 visual tokens)")
        if dtype is None and torch.device(device).type == "cuda":
            dtype = "bfloat16"
        self._setup(device, dtype, batch_size)
        folder = folder_of(path, self.name, self.expected_files, self.source)
        config_path = os.path.join(folder, "config.json")
        if not os.path.isfile(config_path):
            raise files_error(self.name, f"{folder} has no config.json", self.expected_files, self.source)
        with open(config_path, encoding="utf-8") as f:
            arch = (json.load(f).get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ValueError(f"{self.name}: {folder} holds a {arch} model; this reward runs "
                             f"{', '.join(ARCHITECTURES)} (Qwen2-VL, Qwen2.5-VL)")
        try:
            self.processor = transformers.AutoProcessor.from_pretrained(folder)
        except (OSError, ValueError, TypeError) as e:
            raise files_error(self.name, f"the processor files in {folder} cannot be read ({e})", self.expected_files,
                              self.source) from None
        self.processor.tokenizer.padding_side = "left"
        set_pixels(self.processor.image_processor, hi=int(max_pixels))
        check_folder_weights(folder, self.name)    # cut short, a web page or a Git LFS pointer: said by name
        cls = getattr(transformers, arch)
        try:
            self.module = cls.from_pretrained(folder, dtype=self.dtype)
        except (OSError, SafetensorError) as e:          # no weight file, or one that cannot be read
            raise files_error(self.name, f"the model's weights in {folder} cannot be read "
                                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                              self.expected_files, self.source) from None
        except RuntimeError as e:
            if "size mismatch" not in str(e):             # out of memory and the like: not the files' fault
                raise
            raise ValueError(f"{self.name}: the weights in {folder} do not fit its config.json (another model's "
                             f"weights?): {str(e).splitlines()[0]}") from None
        ids = self.processor.tokenizer.encode(answer, add_special_tokens=False)
        if not ids:
            raise ValueError(f"{self.name}: the answer {answer!r} is no token of this model's tokenizer")
        self.answer_id = int(ids[0])
        self.question, self.answer = question, answer
        self._finish()

    def messages(self, prompt: str) -> list[dict]:
        """The chat of one question: a user turn with the image and the question filled in with ``prompt``."""
        return [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": self.question.format(prompt=prompt)}]}]

    def _inputs(self, images: torch.Tensor, prompts: list[str]) -> dict:
        return chat_inputs(self.processor, [self.messages(p) for p in prompts], images, self.device, self.dtype)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """(B,) P(answer) for images (B, 3, H, W) in [0, 1]."""
        # only the last position's logits: at a 152k vocabulary the whole sequence's would cost more than the answer
        logits = self.module(**self._inputs(images, prompts), logits_to_keep=1).logits[:, -1, :].float()
        return torch.softmax(logits, dim=-1)[:, self.answer_id]

    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D) the vision tower's merged patch features averaged over each image, unit-normalised."""
        return vision_features(self.module, self._inputs(images, [""] * images.shape[0]))

    @staticmethod
    def p_yes_by_hand(logits: torch.Tensor, answer_id: int) -> torch.Tensor:
        """``exp(l[yes]) / Σ exp(l)`` per row of ``logits`` (B, V): the VQAScore formula, written out."""
        m = logits.max(-1, keepdim=True).values
        e = (logits - m).exp()
        return e[:, answer_id] / e.sum(-1)
