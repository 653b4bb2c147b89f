"""Random-weight reward models of the real architectures, saved in the formats and folder layouts users
have (see treegrpo/rewards/*.py). Shared by tests/unit/test_rewards.py and benchmarks/bench_rewards.py.

``size="tiny"`` builds small configs of the same architectures (open_clip configs registered under
``treegrpo-tiny-*``, a tiny transformers CLIPModel, ImageReward with a 2-layer BERT via its med_config);
``size="real"`` builds the published sizes (ViT-H-14, ViT-L-14, full ImageReward). Weights are random:
scores are meaningless, only wiring and formats are tested.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

TINY_CLIP = "treegrpo-tiny-clip"            # quick_gelu, embed 64
TINY_CLIP_768 = "treegrpo-tiny-clip-768"    # embed 768, like ViT-L-14's (for the aesthetic head)
TINY_HPS = "treegrpo-tiny-hps"              # GELU, embed 64, head_width 32 like ViT-H's non-64 heads

_TINY_CONFIGS = {
    # head width 64 like OpenAI's models (open_clip's OpenAI loader infers heads = width / 64)
    TINY_CLIP: {"embed_dim": 64, "quick_gelu": True,
                "vision_cfg": {"image_size": 224, "layers": 2, "width": 128, "head_width": 64, "patch_size": 32},
                "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2}},
    TINY_CLIP_768: {"embed_dim": 768, "quick_gelu": True,
                    "vision_cfg": {"image_size": 224, "layers": 2, "width": 128, "head_width": 64, "patch_size": 32},
                    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2}},
    TINY_HPS: {"embed_dim": 64,
               "vision_cfg": {"image_size": 224, "layers": 2, "width": 96, "head_width": 32, "patch_size": 32},
               "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}},
}
_registered = False


def register_tiny_configs() -> None:
    """Register the tiny open_clip architectures (``open_clip.add_model_config``), once per process."""
    global _registered
    if _registered:
        return
    import open_clip
    d = tempfile.mkdtemp(prefix="treegrpo-openclip-cfg-")
    for name, cfg in _TINY_CONFIGS.items():
        with open(os.path.join(d, f"{name}.json"), "w") as fh:
            json.dump(cfg, fh)
    open_clip.add_model_config(d)
    _registered = True


def randomize_(module: nn.Module, seed: int, std: float = 0.02) -> nn.Module:
    """Give every parameter (meta or real) seeded random values: norms ~1, everything else N(0, std²);
    a ``logit_scale`` gets log(100). Fast for billion-parameter models built on the meta device."""
    g = torch.Generator().manual_seed(seed)
    norms = (nn.LayerNorm,)
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if name == "logit_scale":
                val = torch.full(p.shape, math.log(100.0))
            elif isinstance(mod, norms) and name == "weight":
                val = 1.0 + std * torch.randn(p.shape, generator=g)
            elif isinstance(mod, norms) and name == "bias":
                val = std * torch.randn(p.shape, generator=g)
            else:
                val = std * torch.randn(p.shape, generator=g)
            setattr(mod, name, nn.Parameter(val, requires_grad=False))
    return module


def _empty():
    from accelerate import init_empty_weights
    return init_empty_weights(include_buffers=False)


def open_clip_model(arch: str, seed: int = 0) -> nn.Module:
    """A random open_clip CLIP of architecture ``arch`` (tiny names registered on demand). Tiny models get
    larger weights (std 0.1) so that their embeddings depend visibly on the image."""
    from open_clip.model import CLIP
    import open_clip
    register_tiny_configs()
    cfg = open_clip.get_model_config(arch)
    with _empty():
        model = CLIP(**cfg)
    return randomize_(model, seed, std=0.1 if arch.startswith("treegrpo-tiny") else 0.02).eval()


def save_open_clip(model: nn.Module, path: str, fmt: str = "open_clip", half: bool = False) -> str:
    """Save ``model`` as a user has it: ``open_clip`` (plain state dict, ``.bin``/``.pt``/``.safetensors``),
    ``hps`` (``{'state_dict': ...}``), ``torchscript`` (OpenAI's jit archive) or ``hf`` (transformers keys)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "attn_mask"}
    if half:
        sd = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    if fmt == "torchscript":
        # like OpenAI's archives: the attention mask is a constant, and three metadata tensors are buffers
        import copy
        m = copy.deepcopy(model)
        mask = m._buffers.pop("attn_mask")
        m.attn_mask = mask
        ctx = m.context_length
        for k, v in (("input_resolution", m.visual.image_size[0]), ("context_length", ctx), ("vocab_size", m.vocab_size)):
            delattr(m, k) if hasattr(m, k) else None
            m.register_buffer(k, torch.tensor(v))
        img = torch.ones(1, 3, *m.visual.image_size)
        txt = torch.zeros(1, ctx, dtype=torch.long)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer and TorchScript deprecation warnings
            traced = torch.jit.trace_module(m, {"forward": (img, txt)}, check_trace=False)
            torch.jit.save(traced, path)
    elif fmt == "hf":
        from safetensors.torch import save_file
        save_file(open_clip_to_hf(sd), path)
    elif fmt == "hps":
        torch.save({"state_dict": sd}, path)
    elif path.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in sd.items()}, path)
    else:
        torch.save(sd, path)
    return path


def open_clip_to_hf(sd: dict) -> dict:
    """open_clip keys → transformers CLIPModel keys (the inverse of treegrpo's conversion, written out
    independently from transformers' naming, to test it)."""
    out = {}
    for src_tower, dst_tower, prefix in (("visual.transformer.resblocks", "vision_model", "visual."),
                                         ("transformer.resblocks", "text_model", "")):
        for k, v in sd.items():
            if not k.startswith(src_tower + "."):
                continue
            i, rest = k[len(src_tower) + 1:].split(".", 1)
            d = f"{dst_tower}.encoder.layers.{i}."
            if rest.startswith("attn.in_proj_"):
                t = rest.rsplit("_", 1)[1]
                q, kk, vv = v.chunk(3)
                out[d + f"self_attn.q_proj.{t}"], out[d + f"self_attn.k_proj.{t}"], out[d + f"self_attn.v_proj.{t}"] = \
                    q.clone(), kk.clone(), vv.clone()
            else:
                ren = {"attn.out_proj": "self_attn.out_proj", "ln_1": "layer_norm1", "ln_2": "layer_norm2",
                       "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
                mod, t = rest.rsplit(".", 1)
                out[d + f"{ren[mod]}.{t}"] = v
    simple = {"visual.class_embedding": "vision_model.embeddings.class_embedding",
              "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
              "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
              "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
              "positional_embedding": "text_model.embeddings.position_embedding.weight",
              "logit_scale": "logit_scale"}
    for t in ("weight", "bias"):
        simple[f"visual.ln_pre.{t}"] = f"vision_model.pre_layrnorm.{t}"
        simple[f"visual.ln_post.{t}"] = f"vision_model.post_layernorm.{t}"
        simple[f"ln_final.{t}"] = f"text_model.final_layer_norm.{t}"
    for a, b in simple.items():
        out[b] = sd[a]
    out["visual_projection.weight"] = sd["visual.proj"].t()
    out["text_projection.weight"] = sd["text_projection"].t()
    return {k: v.contiguous() for k, v in out.items()}


def hf_clip_config(arch: str):
    """The transformers CLIPConfig equal to an open_clip architecture (QuickGELU models only)."""
    import open_clip
    from transformers import CLIPConfig
    register_tiny_configs()
    c = open_clip.get_model_config(arch)
    v, t = c["vision_cfg"], c["text_cfg"]
    act = "quick_gelu" if c.get("quick_gelu") else "gelu"
    return CLIPConfig(
        text_config=dict(hidden_size=t["width"], intermediate_size=4 * t["width"], num_hidden_layers=t["layers"],
                         num_attention_heads=t["heads"], vocab_size=t["vocab_size"], max_position_embeddings=77,
                         hidden_act=act, layer_norm_eps=1e-5),
        vision_config=dict(hidden_size=v["width"], intermediate_size=4 * v["width"], num_hidden_layers=v["layers"],
                           num_attention_heads=v["width"] // v.get("head_width", 64), image_size=v["image_size"],
                           patch_size=v["patch_size"], hidden_act=act, layer_norm_eps=1e-5),
        projection_dim=c["embed_dim"])


# ---------------------------------------------------------------------------------------------------------------
# per model: files in the layout a user has
# ---------------------------------------------------------------------------------------------------------------

def make_hps_file(folder: str, size: str = "tiny", seed: int = 1, name: str = "HPS_v2.1_compressed.pt") -> tuple[str, str]:
    """``HPS_v2.1_compressed.pt`` = ``{'state_dict': open_clip keys}`` (half precision, as compressed). Returns
    (path, arch)."""
    arch = TINY_HPS if size == "tiny" else "ViT-H-14"
    return save_open_clip(open_clip_model(arch, seed), os.path.join(folder, name), "hps", half=True), arch


def make_clip_file(folder: str, fmt: str = "torchscript", size: str = "tiny", seed: int = 2,
                   arch: str | None = None) -> tuple[str, str]:
    arch = arch or (TINY_CLIP if size == "tiny" else "ViT-L-14")
    name = {"torchscript": "ViT-L-14.pt", "open_clip": "open_clip_pytorch_model.bin", "hf": "model.safetensors",
            "safetensors": "open_clip_model.safetensors"}[fmt]
    path = os.path.join(folder, name)
    save_open_clip(open_clip_model(arch, seed), path, "open_clip" if fmt == "safetensors" else fmt)
    return path, arch


def make_aesthetic_folder(folder: str, size: str = "tiny", clip_fmt: str = "torchscript", seed: int = 3) -> tuple[str, str]:
    """Folder with ``sac+logos+ava1-l14-linearMSE.pth`` (bare state dict ``layers.{0,2,4,6,7}``) and
    the CLIP ViT-L/14 file. Returns (folder, arch)."""
    from treegrpo.rewards.aesthetic import AestheticHead
    os.makedirs(folder, exist_ok=True)
    arch = TINY_CLIP_768 if size == "tiny" else "ViT-L-14"
    make_clip_file(folder, clip_fmt, arch=arch, seed=seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = AestheticHead(768)
    for lin in head.layers:  # torch's default init ×3 per layer, so that scores vary visibly between images
        if isinstance(lin, nn.Linear):
            lin.weight.data.mul_(3.0)
    torch.save(head.state_dict(), os.path.join(folder, "sac+logos+ava1-l14-linearMSE.pth"))
    return folder, arch


def write_clip_tokenizer(folder: str):
    """The CLIP tokenizer files of ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` (vocab.json, merges.txt,
    tokenizer_config.json, special_tokens_map.json, tokenizer.json) built from open_clip's shipped BPE."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer
    os.makedirs(folder, exist_ok=True)
    merges = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in merges]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(folder, "vocab.json"), "w") as fh:
        json.dump({v: i for i, v in enumerate(vocab)}, fh)
    with open(os.path.join(folder, "merges.txt"), "w") as fh:
        fh.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    tok = CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"), model_max_length=77,
                        pad_token="<|endoftext|>")
    tok.save_pretrained(folder)
    return tok


# preprocessor_config.json of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (transformers 4.x format)
LAION_PREPROCESSOR = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
                      "feature_extractor_type": "CLIPFeatureExtractor",
                      "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224}


def make_pickscore_folder(folder: str, size: str = "tiny", seed: int = 4, processor_subdir: str = "processor") -> str:
    """``PickScore_v1`` model folder (config.json + model.safetensors) with the processor files in
    ``processor_subdir`` (``""``: merged into the model folder)."""
    from transformers import CLIPConfig, CLIPModel
    if size == "tiny":
        cfg = CLIPConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                          vocab_size=49408, max_position_embeddings=77, hidden_act="gelu"),
                         vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, image_size=224, patch_size=32, hidden_act="gelu"),
                         projection_dim=16)
    else:  # ViT-H-14 as in PickScore_v1/config.json
        cfg = CLIPConfig(text_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                          num_attention_heads=16, vocab_size=49408, max_position_embeddings=77,
                                          hidden_act="gelu"),
                         vision_config=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                            num_attention_heads=16, image_size=224, patch_size=14, hidden_act="gelu"),
                         projection_dim=1024)
    with _empty():
        model = CLIPModel(cfg)
    randomize_(model, seed)
    model.save_pretrained(folder)
    proc = os.path.join(folder, processor_subdir) if processor_subdir else folder
    write_clip_tokenizer(proc)
    with open(os.path.join(proc, "preprocessor_config.json"), "w") as fh:
        json.dump(LAION_PREPROCESSOR, fh)
    return folder


# med_config.json as published with ImageReward (BLIP's BERT-base config); num_hidden_layers may be reduced
MED_CONFIG = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
              "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
              "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2,
              "vocab_size": 30524, "encoder_width": 768, "add_cross_attention": True}

TINY_BERT_VOCAB = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                   + list("abcdefghijklmnopqrstuvwxyz0123456789,.!")
                   + ["a", "photo", "of", "the", "red", "blue", "cat", "dog", "on", "in", "##s", "##ing", "sunset",
                      "mountain", "painting"])


def make_imagereward_folder(folder: str, bert_layers: int = 2, seed: int = 5, tokenizer_subdir: str = "") -> str:
    """Folder with ``ImageReward.pt`` (flat state dict ``blip.*``/``mlp.*`` of the package's ImageReward
    model), ``med_config.json`` and a BERT tokenizer (a small uncased vocabulary with bert-base-uncased's
    special-token ids) in ``tokenizer_subdir``. The ViT-L image encoder is full size (fixed by BLIP)."""
    from treegrpo.rewards.imagereward import _blip_modules, load_tokenizer
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "med_config.json"), "w") as fh:
        json.dump(dict(MED_CONFIG, num_hidden_layers=bert_layers), fh)
    tok_dir = os.path.join(folder, tokenizer_subdir)
    os.makedirs(tok_dir, exist_ok=True)
    with open(os.path.join(tok_dir, "vocab.txt"), "w") as fh:
        fh.write("\n".join(dict.fromkeys(TINY_BERT_VOCAB)) + "\n")
    ir, bp = _blip_modules()
    tok = load_tokenizer(tok_dir)
    original = bp.init_tokenizer
    bp.init_tokenizer = lambda: tok
    try:
        with _empty():
            model = ir.ImageReward(med_config=os.path.join(folder, "med_config.json"), device="cpu")
    finally:
        bp.init_tokenizer = original
    randomize_(model, seed)
    g = torch.Generator().manual_seed(seed)
    for lin in model.mlp.layers:  # larger than the 0.02 default, so rewards differ visibly between images
        if isinstance(lin, nn.Linear):
            lin.weight.data.normal_(0.0, 0.05, generator=g)
            lin.bias.data.normal_(0.0, 0.05, generator=g)
    sd = {k: v for k, v in model.state_dict().items()}
    torch.save(sd, os.path.join(folder, "ImageReward.pt"))
    return folder


#: the published Qwen2-VL sizes (config.json of Qwen/Qwen2-VL-2B-Instruct and -7B-Instruct): text and vision widths
#: and depths; the benchmarks build them at these widths with fewer layers and extrapolate per layer
QWEN2VL_PUBLISHED = {
    "2b": dict(text=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
               vision=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4)),
    "7b": dict(text=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
               vision=dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, mlp_ratio=4)),
}


def qwen2vl_config(size: str, ids: dict, vocab: int, text_layers=None, vision_depth=None, max_pixels=28 * 28 * 16):
    """A Qwen2VLConfig: ``size`` "tiny" (the tests' model) or a key of :data:`QWEN2VL_PUBLISHED` (its widths, its
    depths unless ``text_layers`` / ``vision_depth`` say fewer); ``ids`` the special tokens' ids, ``vocab`` the
    tokenizer's size (the published vocabulary is kept when larger)."""
    from transformers import Qwen2VLConfig

    if size == "tiny":
        text = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=512,
                    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
        vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2)
    else:
        pub = QWEN2VL_PUBLISHED[size]
        text = dict(pub["text"], vocab_size=max(vocab, pub["text"]["vocab_size"]), max_position_embeddings=32768)
        vision = dict(pub["vision"])
    if text_layers:
        text["num_hidden_layers"] = int(text_layers)
    if vision_depth:
        vision["depth"] = int(vision_depth)
    return Qwen2VLConfig(
        text_config=dict(text, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"]),
        vision_config=dict(vision, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=text.get("tie_word_embeddings", False))


def make_qwen2vl_folder(folder: str, seed: int = 6, size: str = "tiny", text_layers=None, vision_depth=None,
                        max_pixels: int = 28 * 28 * 16, save_weights: bool = True) -> str:
    """A random Qwen2-VL model folder in the published layout (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, processor and chat template files), with a byte-level BPE tokenizer trained here on a few
    sentences (Qwen's special tokens included) and the Qwen2-VL chat template's image turn. ``size``: "tiny" (the
    tests'), or "2b" / "7b" at the published widths (:func:`qwen2vl_config`; with ``text_layers`` /
    ``vision_depth`` fewer layers, as the benchmark times them). ``save_weights=False``: config and processor only."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (Qwen2TokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor)

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
               "<|video_pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ['Does this image show: "a red circle"? Answer yes or no.', "Yes", "No", "user assistant",
              'a storefront sign that says "OPEN"', "Is the text legible?"] * 3
    vocab = 300
    if size != "tiny":      # the published models' prompts in about as many tokens as Qwen's own tokenizer makes
        from treegrpo.rewards import hpsv3, vlm_judge

        corpus += [hpsv3.INSTRUCTION + hpsv3.REWARD_PROMPT, vlm_judge.DEFAULT_QUESTION] * 3
        vocab = 4000
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None)
    template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
                "{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'image' %}"
                "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
                "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    if size != "tiny":      # the published processor's bounds (preprocessor_config.json of Qwen2-VL-*-Instruct)
        min_pixels, max_pixels = 56 * 56, 28 * 28 * 16384
    else:
        min_pixels = 28 * 28 * 4
    proc = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels),
                            tokenizer=fast, video_processor=Qwen2VLVideoProcessor(), chat_template=template)
    ids = {t: fast.convert_tokens_to_ids(t) for t in special}
    cfg = qwen2vl_config(size, ids, len(fast), text_layers, vision_depth)
    os.makedirs(folder, exist_ok=True)
    proc.save_pretrained(folder)
    if not save_weights:
        cfg.architectures = ["Qwen2VLForConditionalGeneration"]
        cfg.save_pretrained(folder)
        return folder
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    if size == "tiny":
        with torch.no_grad():      # logits spread enough that P(yes) differs from image to image
            model.lm_head.weight.mul_(20.0)
    model.save_pretrained(folder)
    return folder


def make_hpsv3_folder(folder: str, seed: int = 7, size: str = "tiny", text_layers=None, vision_depth=None) -> str:
    """A random HPSv3 in the published layout: the Qwen2-VL's config and processor files (as Qwen2-VL-7B-Instruct's
    folder holds them; ``size`` "tiny" or "7b" with fewer layers, as :func:`make_qwen2vl_folder`) and ``HPSv3.safetensors`` with the whole reward model's weights under the transformers 4.x key
    names the published file has (``model.layers…``, ``visual…``, ``lm_head``, ``rm_head.0`` … ``rm_head.5``), the
    vocabulary grown by ``<|Reward|>``."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoProcessor, Qwen2VLForConditionalGeneration

    from treegrpo.rewards.hpsv3 import REWARD_TOKEN, ranknet_head

    make_qwen2vl_folder(folder, seed=seed, size=size, text_layers=text_layers, vision_depth=vision_depth,
                        save_weights=False)                          # the base weights are not needed
    tok = AutoProcessor.from_pretrained(folder).tokenizer
    tok.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
    cfg = AutoConfig.from_pretrained(folder)
    # the published file: Qwen2-VL's tokenizer (151657 tokens) grown by the reward token
    cfg.text_config.vocab_size = len(tok) if size == "tiny" else 151658
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    head = ranknet_head(cfg.text_config.hidden_size)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
    state = {}
    for k, v in model.state_dict().items():
        k = k.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
        state[k] = v.contiguous()
    state.update({f"rm_head.{k}": v.contiguous() for k, v in head.state_dict().items()})
    save_file(state, os.path.join(folder, "HPSv3.safetensors"))
    return folder


# ---------------------------------------------------------------------------------------------------------------
# Drawn text for the OCR reward: the fonts matplotlib ships (every machine with the pack has them) and Pillow's own

FONTS = os.path.join(os.path.dirname(__import__("matplotlib").__file__), "mpl-data", "fonts", "ttf")
FACES = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono-Bold.ttf", None]          # None: Pillow's own font
GROUND = (240, 235, 220)                                                               # paper colour, RGB 0–255


def _font(face, px):
    from PIL import ImageFont

    return ImageFont.truetype(os.path.join(FONTS, face), px) if face else ImageFont.load_default(size=px)


def drawn_text(text: str, face: str | None = None, px: int = 48, size: int = 256, cover: float = 0.0,
               colour=(20, 20, 20)) -> torch.Tensor:
    """(3, size, size) in [0, 1]: ``text`` centred in ``face`` (a file in :data:`FONTS`, None: Pillow's own) at
    ``px`` pixels on a paper-coloured ground, its right ``cover`` share hidden under a box of the ground's colour."""
    import numpy as np
    from PIL import Image, ImageDraw

    font = _font(face, px)
    im = Image.new("RGB", (size, size), GROUND)
    d = ImageDraw.Draw(im)
    d.text((size // 2, size // 2), text, fill=colour, font=font, anchor="mm")
    if cover:
        x0, y0, x1, y1 = d.textbbox((size // 2, size // 2), text, font=font, anchor="mm")
        d.rectangle((x1 - cover * (x1 - x0), y0 - 2, x1 + 2, y1 + 2), fill=GROUND)
    return torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1)


def text_width(text: str, face: str | None, px: int) -> int:
    """The drawn width of ``text`` in pixels (its ink box), to tell text that fits its picture from text cut off."""
    from PIL import Image, ImageDraw

    x0, _, x1, _ = ImageDraw.Draw(Image.new("RGB", (8, 8))).textbbox((0, 0), text, font=_font(face, px), anchor="mm")
    return x1 - x0
