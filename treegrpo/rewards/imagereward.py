"""ImageReward (Xu et al. 2023): BLIP (ViT-L image encoder + BERT-base text encoder with cross-attention)
and an MLP head, trained on human preference rankings. Runs the ``image-reward`` package's own model code.

Files, as users have them (one folder): ``ImageReward.pt`` (flat state dict ``blip.*`` / ``mlp.*``),
``med_config.json`` (the BERT config), and the ``bert-base-uncased`` tokenizer (``vocab.txt``, optionally
``tokenizer_config.json`` / ``tokenizer.json`` / ``special_tokens_map.json``) in the folder itself or in
its subfolder ``bert-base-uncased/``. ``ImageReward.load`` would fetch all of these from a hub; here they
are read from the folder and a missing one is named.

Installed without its pinned dependencies (``pip install --no-deps image-reward==1.5``, see ``treegrpo.deps``):
the model files run on timm 1.x, and fairscale (imported by BLIP's ``vit.py`` for gradient checkpointing only) is
replaced by an identity stand-in while they are imported when it is absent.

Compatibility with transformers 5: the package's BLIP text encoder (``med.py``, copied from transformers
4.15) imports helpers that moved or were removed and relies on ``init_weights``/``get_head_mask``/
``invert_attention_mask`` of the old ``PreTrainedModel``. ``_blip_modules`` restores those — on
``transformers.modeling_utils`` only where a name is missing, and on the package's own BERT classes —
and imports the package's model files without its ``__init__`` (which would import the OpenAI ``clip``
package, ``datasets`` and its training script).

Scoring as ``ImageReward.score``: image preprocessing = shorter side to 224 (bicubic), centre crop,
OpenAI CLIP mean/std; prompt tokenised with ``padding='max_length', truncation=True, max_length=35``;
reward = ``(mlp(text_cls_feature) − 0.16717362830052426) / 1.0333394966054072``.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import importlib.util
import os
import sys
import threading
import types
from typing import Optional

import torch

from .base import register
from .torch_reward import (OPENAI_MEAN, OPENAI_STD, TorchReward, empty_init, files_error, folder_of, load_into,
                           nearby_folders, normalize, read_weights, resize_shortest_crop, wrong_file)

MEAN, STD = 0.16717362830052426, 1.0333394966054072
MAX_LENGTH = 35
_PKG = "_treegrpo_imagereward"
_lock = threading.Lock()


def _compat_transformers() -> None:
    """Names the BLIP code imports from ``transformers.modeling_utils`` (moved to ``pytorch_utils`` or
    removed in transformers 5); added only where missing."""
    import transformers.modeling_utils as mu
    import transformers.pytorch_utils as pu
    for n in ("apply_chunking_to_forward", "prune_linear_layer", "find_pruneable_heads_and_indices"):
        if not hasattr(mu, n):
            if hasattr(pu, n):
                setattr(mu, n, getattr(pu, n))
            else:
                setattr(mu, n, _find_pruneable_heads_and_indices)


def _find_pruneable_heads_and_indices(heads, n_heads, head_size, already_pruned):  # pragma: no cover - pruning unused
    mask = torch.ones(n_heads, head_size)
    heads = set(heads) - already_pruned
    for head in heads:
        head = head - sum(1 if h < head else 0 for h in already_pruned)
        mask[head] = 0
    mask = mask.view(-1).contiguous().eq(1)
    index = torch.arange(len(mask))[mask].long()
    return heads, index


def _init_weights(self):
    self.apply(self._init_weights)


def _get_head_mask(self, head_mask, num_hidden_layers, is_attention_chunked=False):
    if head_mask is not None:  # pragma: no cover - never passed by ImageReward
        raise NotImplementedError("head_mask is not supported")
    return [None] * num_hidden_layers


def _invert_attention_mask(self, mask):
    ext = mask[:, None, :, :] if mask.dim() == 3 else mask[:, None, None, :]
    ext = ext.to(dtype=self.dtype)
    return (1.0 - ext) * torch.finfo(self.dtype).min


@contextlib.contextmanager
def _fairscale_stand_in():
    """BLIP's ``vit.py`` imports ``checkpoint_wrapper`` from fairscale, which it calls only when gradient
    checkpointing is on (never for ImageReward). Without fairscale installed (the pack installs image-reward with
    ``--no-deps``), an identity wrapper stands in while the file is imported; the stand-in modules are removed again,
    so no other code sees a fake fairscale."""
    if importlib.util.find_spec("fairscale") is not None:
        yield
        return
    names = ["fairscale", "fairscale.nn", "fairscale.nn.checkpoint", "fairscale.nn.checkpoint.checkpoint_activations"]
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    sys.modules[names[-1]].checkpoint_wrapper = lambda module, *a, **k: module
    try:
        yield
    finally:
        for n in names:
            sys.modules.pop(n, None)


def _blip_modules():
    """(ImageReward module, blip_pretrain module) of the installed ``image-reward`` package."""
    with _lock:
        if f"{_PKG}.ImageReward" in sys.modules:
            return sys.modules[f"{_PKG}.ImageReward"], sys.modules[f"{_PKG}.models.BLIP.blip_pretrain"]
        from ..deps import require_optional
        require_optional("ImageReward")
        spec = importlib.util.find_spec("ImageReward")
        _compat_transformers()
        root = os.path.dirname(spec.origin)
        for name, sub in ((_PKG, ""), (f"{_PKG}.models", "models")):
            if name not in sys.modules:  # namespace shells: their __init__ files are not run
                m = types.ModuleType(name)
                m.__path__ = [os.path.join(root, sub) if sub else root]
                m.__package__ = name
                sys.modules[name] = m
        with _fairscale_stand_in():   # models/BLIP/__init__ imports vit.py (and so fairscale) first
            med = importlib.import_module(f"{_PKG}.models.BLIP.med")
            if "init_weights" not in med.BertPreTrainedModel.__dict__:
                med.BertPreTrainedModel.init_weights = _init_weights
            for n, f in (("get_head_mask", _get_head_mask), ("invert_attention_mask", _invert_attention_mask)):
                if not hasattr(med.BertModel, n):
                    setattr(med.BertModel, n, f)
            bp = importlib.import_module(f"{_PKG}.models.BLIP.blip_pretrain")
            ir = importlib.import_module(f"{_PKG}.ImageReward")
        return ir, bp


def load_tokenizer(folder: str):
    """BLIP's tokenizer (``init_tokenizer``) from local ``bert-base-uncased`` files: BERT + ``[DEC]`` as
    bos token + ``[ENC]`` as an additional special token (vocabulary 30524)."""
    from transformers import BertTokenizer
    tok = BertTokenizer.from_pretrained(folder, local_files_only=True)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    tok.enc_token_id = tok.convert_tokens_to_ids("[ENC]")
    return tok


#: med_config.json fields and the ImageReward.pt weight (and axis) whose size each must equal
MED_FIELDS = (("vocab_size", "blip.text_encoder.embeddings.word_embeddings.weight", 0),
              ("hidden_size", "blip.text_encoder.embeddings.word_embeddings.weight", 1),
              ("intermediate_size", "blip.text_encoder.encoder.layer.0.intermediate.dense.weight", 0))
# (encoder_width is not compared: BLIP sets it from the vision encoder, whatever the file says)


def check_med_config(med: str, sd: dict, name: str) -> None:
    """Blame ``med_config.json`` (not the checkpoint) when the BERT it describes is not the one ImageReward.pt
    holds: its sizes and layer count are compared with the weights' shapes before any model is built."""
    try:
        with open(med, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        raise wrong_file(name, med, f"not readable as JSON: {e}", "the med_config.json of ImageReward (a BERT "
                         "config)") from None
    if not isinstance(cfg, dict):
        raise wrong_file(name, med, "not a JSON object", "the med_config.json of ImageReward (a BERT config)")
    wrong = [f"{field} {cfg.get(field)!r} (the checkpoint's is {sd[key].shape[axis]})"
             for field, key, axis in MED_FIELDS if key in sd and cfg.get(field) != sd[key].shape[axis]]
    layers = {int(k.split(".")[4]) for k in sd if k.startswith("blip.text_encoder.encoder.layer.")}
    if layers and cfg.get("num_hidden_layers") != max(layers) + 1:
        wrong.append(f"num_hidden_layers {cfg.get('num_hidden_layers')!r} (the checkpoint has {max(layers) + 1})")
    if wrong:
        raise wrong_file(name, med, f"it describes another text encoder than ImageReward.pt holds: {'; '.join(wrong)}",
                         "the med_config.json published with ImageReward.pt (THUDM/ImageReward)")


@register("image_reward")
class ImageRewardModel(TorchReward):
    """ImageReward v1.0. Options: ``tokenizer_path`` (the bert-base-uncased tokenizer folder, when it is
    neither the model folder nor its subfolder ``bert-base-uncased/``), ``dtype`` (auto: fp16 on CUDA; the
    MLP head runs in float32 as in the reference), ``batch_size`` (32)."""

    name = "image_reward"
    requires_module = "ImageReward"    # installed with --no-deps (treegrpo.deps.OPTIONAL)
    expected_files = ("a folder with ImageReward.pt, med_config.json and the bert-base-uncased tokenizer files "
                      "(vocab.txt, optionally tokenizer_config.json, tokenizer.json, special_tokens_map.json) in the "
                      "folder itself, in a subfolder, or in a sibling folder named like bert-base-uncased (a Hub download or "
                      "cache folder)")
    is_folder = True
    licence = "Apache-2.0 (the tokenizer: Apache-2.0)"
    source = ("ImageReward.pt and med_config.json: THUDM/ImageReward on Hugging Face (project github THUDM/ImageReward); "
              "the tokenizer: google-bert/bert-base-uncased on Hugging Face")

    def __init__(self, path=None, device="cpu", *, tokenizer_path: Optional[str] = None, dtype=None,
                 batch_size: int = 32):
        from ..deps import require_optional
        require_optional("ImageReward")     # before the files: installing it is the first thing to do
        self._setup(device, dtype, batch_size)
        folder = folder_of(path, self.name, self.expected_files, self.source)
        ckpt, med = os.path.join(folder, "ImageReward.pt"), os.path.join(folder, "med_config.json")
        if tokenizer_path is not None:
            tok_dir = os.path.abspath(tokenizer_path)
            if not os.path.isfile(os.path.join(tok_dir, "vocab.txt")):
                raise files_error(self.name, f"{tok_dir} has no vocab.txt", self.expected_files, self.source)
        else:
            tok_dir = next((d for d in nearby_folders(folder, "bert-base-uncased")
                            if os.path.isfile(os.path.join(d, "vocab.txt"))), None)
        missing = [f for f, p in (("ImageReward.pt", ckpt), ("med_config.json", med)) if not os.path.isfile(p)]
        if tok_dir is None:
            missing.append("vocab.txt (bert-base-uncased tokenizer)")
        if missing:
            raise files_error(self.name, f"{folder} lacks {', '.join(missing)}", self.expected_files, self.source)

        ir, bp = _blip_modules()
        self.tokenizer = load_tokenizer(tok_dir)
        sd = read_weights(ckpt, self.name)
        if not any(k.startswith("blip.visual_encoder.") for k in sd):
            raise wrong_file(self.name, ckpt, f"no 'blip.visual_encoder.*' weights (keys start {sorted(sd)[:3]})",
                             "ImageReward.pt (a flat state dict with blip.* and mlp.* weights)")
        check_med_config(med, sd, self.name)
        with _lock:
            original = bp.init_tokenizer
            bp.init_tokenizer = lambda: self.tokenizer  # BLIP_Pretrain would fetch bert-base-uncased
            try:
                with empty_init():
                    model = ir.ImageReward(med_config=med, device="cpu")
            except (OSError, ValueError, TypeError) as e:
                raise wrong_file(self.name, med, str(e), "the med_config.json of ImageReward (a BERT config)") from e
            finally:
                bp.init_tokenizer = original
        # vision_proj / text_proj belong to BLIP pre-training and are unused by the reward
        load_into(model, sd, self.name, ckpt, "ImageReward.pt", optional=("blip.vision_proj.", "blip.text_proj."))
        vocab = model.blip.text_encoder.embeddings.word_embeddings.num_embeddings
        if len(self.tokenizer) > vocab:
            raise ValueError(f"{self.name}: the tokenizer in {tok_dir} has {len(self.tokenizer)} tokens but the model "
                             f"only {vocab}: it is not bert-base-uncased's")
        self.module = model
        self.files = {"checkpoint": ckpt, "med_config": med, "tokenizer": tok_dir}
        self._finish()

    def _keep_fp32(self):
        self.module.mlp.float()

    def preprocess(self, images):
        return normalize(resize_shortest_crop(images, 224), OPENAI_MEAN, OPENAI_STD)

    def _score(self, images, prompts):
        blip = self.module.blip
        x = self.preprocess(images).to(self.dtype)
        tok = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        image_embeds = blip.visual_encoder(x)
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device)
        out = blip.text_encoder(tok.input_ids.to(self.device), attention_mask=tok.attention_mask.to(self.device),
                                encoder_hidden_states=image_embeds, encoder_attention_mask=image_atts, return_dict=True)
        feat = out.last_hidden_state[:, 0, :].float()
        return ((self.module.mlp(feat) - MEAN) / STD).squeeze(-1)
