"""Reward models: real architectures with random weights, saved in the files users have, loaded through
``load_reward``, checked against the reference implementations (open_clip, transformers, the
image-reward package) and their preprocessing; clear errors for missing/wrong files and bad batches.
CPU, offline (HF_HUB_OFFLINE=1). Builders: tests/reward_fixtures.py."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

import reward_fixtures as rf  # noqa: E402
from treegrpo.rewards.base import available, load_reward  # noqa: E402
from treegrpo.rewards.torch_reward import OPENAI_MEAN, OPENAI_STD, resolve_dtype  # noqa: E402
from treegrpo.run import build_rewards  # noqa: E402

NAMES = ["image_reward", "hpsv2", "pickscore", "laion_aesthetic", "clipscore"]
PROMPTS = ["a photo of a cat", "a red dog on the mountain", "a photo of a cat"]


def smooth_images(n, h, w, seed=0):
    """Images of uint8 levels (what a reference pipeline reads from PIL), smooth plus some texture."""
    g = torch.Generator().manual_seed(seed)
    x = F.interpolate(torch.rand(n, 3, max(h // 8, 2), max(w // 8, 2), generator=g), size=(h, w), mode="bilinear",
                      align_corners=False)
    x = (0.8 * x + 0.2 * torch.rand(n, 3, h, w, generator=g)).clamp(0, 1)
    return (x * 255).round() / 255


def to_pil(x):
    return Image.fromarray((x.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))


def assert_pixels_close(ours, ref):
    """Tensor resampling vs PIL's: same geometry and constants, values within uint8-rounding noise."""
    assert ours.shape == ref.shape
    d = (ours.float() - ref.float()).abs()
    assert d.mean() < 0.01 and d.max() < 0.1, (d.mean().item(), d.max().item())


def reference_clip_transform(n_px=224):
    """OpenAI CLIP's ``_transform`` (also ImageReward's and the aesthetic predictor's)."""
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor
    return Compose([Resize(n_px, interpolation=InterpolationMode.BICUBIC), CenterCrop(n_px),
                    lambda im: im.convert("RGB"), ToTensor(), Normalize(OPENAI_MEAN, OPENAI_STD)])


def reference_hps_transform(n_px=224):
    """hpsv2's ``preprocess_val``: its ResizeMaxSize (longer side to n_px, pad with black), ToTensor, Normalize."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    def resize_max(img):
        w, h = img.size
        scale = n_px / float(max(h, w))
        if scale != 1.0:
            nh, nw = round(h * scale), round(w * scale)
            img = TF.resize(img, [nh, nw], InterpolationMode.BICUBIC)
            ph, pw = n_px - nh, n_px - nw
            img = TF.pad(img, padding=[pw // 2, ph // 2, pw - pw // 2, ph - ph // 2], fill=0)
        return img

    return lambda im: TF.normalize(TF.to_tensor(resize_max(im).convert("RGB")), OPENAI_MEAN, OPENAI_STD)


# ------------------------------------------------------------------------------------------------------------
# registry, attributes, missing files
# ------------------------------------------------------------------------------------------------------------

def test_registry_names_and_attributes():
    from treegrpo.rewards.base import _REGISTRY
    names = available()
    for n in NAMES + ["jpeg_compressibility", "jpeg_incompressibility", "demo_adherence"]:
        assert n in names
    for n in NAMES:
        cls = _REGISTRY[n]
        assert cls.name == n and isinstance(cls.expected_files, str) and cls.expected_files
        assert isinstance(cls.is_folder, bool) and cls.source
    assert [n for n in NAMES if _REGISTRY[n].is_folder] == ["image_reward", "pickscore", "laion_aesthetic"]


SOURCES = {"image_reward": "THUDM/ImageReward", "hpsv2": "HPSv2", "pickscore": "yuvalkirstain/PickScore_v1",
           "laion_aesthetic": "improved-aesthetic-predictor", "clipscore": "openai/CLIP"}


@pytest.mark.parametrize("name", NAMES)
def test_missing_path_names_files_place_and_source(name, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_reward(name)
    msg = str(e.value)
    assert "no path given" in msg and "models/reward_models" in msg and "`path`" in msg
    assert SOURCES[name] in msg and "Expected:" in msg
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_reward(name, path=str(tmp_path / "nope"))


@pytest.mark.parametrize("name,expect", [
    ("image_reward", "lacks ImageReward.pt, med_config.json, vocab.txt"),
    ("pickscore", "lacks config.json, model.safetensors or pytorch_model.bin"),
    ("laion_aesthetic", r"the aesthetic head not found in .* \(looked for sac\+logos\+ava1-l14-linearMSE.pth"),
    ("hpsv2", "is a folder, a weight file is expected"),
    ("clipscore", "is a folder, a weight file is expected"),
])
def test_empty_folder_lists_the_missing_files(name, expect, tmp_path):
    with pytest.raises(FileNotFoundError, match=expect):
        load_reward(name, path=str(tmp_path))


# ------------------------------------------------------------------------------------------------------------
# HPS v2 / v2.1
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hps(tmp_path_factory):
    path, arch = rf.make_hps_file(str(tmp_path_factory.mktemp("hps")))
    return path, arch, load_reward("hpsv2", path=path, arch=arch)


def test_hps_matches_open_clip_reference(hps):
    import open_clip
    path, arch, model = hps
    imgs = smooth_images(3, 96, 72)                    # portrait: resized to 224x168, padded 28 px left/right
    r = model(imgs, PROMPTS)
    assert r.shape == (3,) and r.dtype == torch.float32 and torch.equal(r, model(imgs, PROMPTS))
    assert r[0] != r[1] and r.abs().max() <= 1.0

    ref_tf = reference_hps_transform()
    ref_px = torch.stack([ref_tf(to_pil(x)) for x in imgs])
    ours_px = model.preprocess(imgs)
    assert_pixels_close(ours_px, ref_px)
    pad = ((0.0 - torch.tensor(OPENAI_MEAN)) / torch.tensor(OPENAI_STD)).view(3, 1)
    assert torch.allclose(ours_px[0, :, :, :28].reshape(3, -1), pad.expand(3, 224 * 28))
    assert not torch.allclose(ours_px[0, :, :, 28], pad.view(3).expand(224, 3).t())

    # the hpsv2 package's scoring, with open_clip's own loading of the checkpoint
    ref = open_clip.create_model(arch, precision="fp32", output_dict=True).eval()
    ref.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    with torch.no_grad():
        out = ref(ref_px, open_clip.get_tokenizer(arch)(PROMPTS))
        want = torch.diagonal(out["image_features"] @ out["text_features"].T)
    assert torch.allclose(r, want, atol=5e-3)
    model.preprocess = lambda x: ref_px.to(x.device)  # same pixels: the model part is exact
    try:
        assert torch.allclose(model(imgs, PROMPTS), want, atol=1e-5)
    finally:
        del model.preprocess


def test_hps_dtype_offload_chunking(hps):
    path, arch, model = hps
    imgs = smooth_images(5, 64, 64, seed=1)
    prompts = PROMPTS + PROMPTS[:2]
    full = model(imgs, prompts)
    assert model.offload() is model and all(p.device.type == "cpu" for p in model.module.parameters())
    chunked = load_reward("hpsv2", path=path, arch=arch, batch_size=2)
    assert torch.allclose(chunked(imgs, prompts), full, atol=1e-5)
    bf16 = load_reward("hpsv2", path=path, arch=arch, dtype="bfloat16")
    assert next(bf16.module.parameters()).dtype == torch.bfloat16
    out = bf16(imgs, prompts)
    assert out.dtype == torch.float32 and torch.allclose(out, full, atol=0.05)
    assert model.to("cpu").load() is model and model.model_size() > 0
    assert resolve_dtype(None, torch.device("cuda")) == torch.float16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("int8", torch.device("cpu"))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        load_reward("hpsv2", path=path, arch=arch, batch_size=0)


@pytest.mark.parametrize("images,prompts,match", [
    (torch.zeros(0, 3, 32, 32), [], "empty image batch"),
    (torch.zeros(2, 3, 32, 32), ["one"], "2 images but 1 prompts; pass one prompt per image"),
    (torch.zeros(2, 32, 32, 3), ["a", "b"], r"images must be \(B, 3, H, W\), got \(2, 32, 32, 3\)"),
])
def test_bad_batches(hps, images, prompts, match):
    with pytest.raises(ValueError, match=f"hpsv2: {match}"):
        hps[2](images, prompts)


def test_wrong_files_are_named(hps, tmp_path):
    path, arch, _ = hps
    junk = tmp_path / "HPS_v2.1_compressed.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="cannot read .*HPS_v2.1_compressed.pt as a torch weight file"):
        load_reward("hpsv2", path=str(junk), arch=arch)
    head = tmp_path / "head.pth"
    torch.save({"layers.0.weight": torch.zeros(2, 2)}, head)
    with pytest.raises(ValueError, match=r"is not the expected file \(.* weights missing, e.g. "):
        load_reward("hpsv2", path=str(head), arch=arch)
    with pytest.raises(ValueError, match=r"weights of the wrong shape, e.g. .*, for open_clip architecture "
                                         f"{rf.TINY_CLIP}"):
        load_reward("hpsv2", path=path, arch=rf.TINY_CLIP)
    with pytest.raises(ValueError, match="unknown open_clip architecture 'ViT-Z-99'"):
        load_reward("hpsv2", path=path, arch="ViT-Z-99")


# ------------------------------------------------------------------------------------------------------------
# CLIPScore
# ------------------------------------------------------------------------------------------------------------

def test_clipscore_all_file_formats_and_reference(tmp_path):
    import open_clip
    from transformers import CLIPModel
    imgs = smooth_images(3, 72, 96, seed=2)
    paths = {fmt: rf.make_clip_file(str(tmp_path / fmt), fmt)[0] for fmt in ("torchscript", "open_clip", "hf", "safetensors")}
    scores = {fmt: load_reward("clipscore", path=p, arch=rf.TINY_CLIP, clamp=False, w=1.0)(imgs, PROMPTS)
              for fmt, p in paths.items()}
    for fmt in scores:
        assert torch.allclose(scores[fmt], scores["torchscript"], atol=1e-5), fmt
    cos = scores["torchscript"]
    assert cos.shape == (3,) and cos[0] != cos[1]

    model = load_reward("clipscore", path=paths["torchscript"], arch=rf.TINY_CLIP)   # 2.5·max(cos, 0)
    assert torch.allclose(model(imgs, PROMPTS), 2.5 * cos.clamp(min=0), atol=1e-5)
    assert model.pre["mean"] == OPENAI_MEAN and model.pre["size"] == 224 and model.pre["interpolation"] == "bicubic"

    ref_px = torch.stack([reference_clip_transform()(to_pil(x)) for x in imgs])
    from treegrpo.rewards.clip_models import clip_preprocess
    assert_pixels_close(clip_preprocess(imgs, model.pre), ref_px)
    # OpenAI-format loading by open_clip itself, and transformers' CLIP on the converted file
    ref = open_clip.load_openai_model(paths["torchscript"], precision="fp32", device="cpu").eval()
    hf = CLIPModel(rf.hf_clip_config(rf.TINY_CLIP)).eval()
    from safetensors.torch import load_file
    hf.load_state_dict(load_file(paths["hf"]), strict=False)
    ours = load_reward("clipscore", path=paths["hf"], arch=rf.TINY_CLIP).module
    tok = open_clip.get_tokenizer(rf.TINY_CLIP)(PROMPTS)
    with torch.no_grad():
        exact = F.cosine_similarity(ours.encode_image(ref_px), ours.encode_text(tok))
        want = F.cosine_similarity(ref.encode_image(ref_px), ref.encode_text(tok))  # fp16-rounded weights (OpenAI)
        hf_img = hf.visual_projection(hf.vision_model(pixel_values=ref_px).pooler_output)
        hf_txt = hf.text_projection(hf.text_model(input_ids=tok).pooler_output)
    assert torch.allclose(F.cosine_similarity(hf_img, hf_txt), exact, atol=1e-5)
    assert torch.allclose(want, exact, atol=2e-3)
    assert torch.allclose(cos, want, atol=0.02)


def test_clipscore_pretrained_tag_sets_preprocessing(tmp_path):
    from treegrpo.rewards.clip_models import preprocess_cfg, pretrained_quick_gelu
    assert pretrained_quick_gelu("ViT-L-14", "openai") and not pretrained_quick_gelu("ViT-H-14", "laion2b_s32b_b79k")
    assert preprocess_cfg("ViT-L-14", "openai", {})["mean"] == OPENAI_MEAN
    assert preprocess_cfg("ViT-B-16", "datacomp_xl_s13b_b90k", {"resize_mode": "squash"})["resize_mode"] == "squash"
    with pytest.raises(ValueError, match="resize_mode must be"):
        preprocess_cfg("ViT-L-14", None, {"resize_mode": "crop"})


# ------------------------------------------------------------------------------------------------------------
# LAION aesthetic
# ------------------------------------------------------------------------------------------------------------

def test_aesthetic_matches_reference_predictor(tmp_path):
    import open_clip
    folder, arch = rf.make_aesthetic_folder(str(tmp_path / "aesthetic"))
    head_file = os.path.join(folder, "sac+logos+ava1-l14-linearMSE.pth")
    imgs = smooth_images(3, 80, 64, seed=3)
    model = load_reward("laion_aesthetic", path=folder, arch=arch)
    r = model(imgs, PROMPTS)
    assert r.shape == (3,) and torch.equal(r, model(imgs, PROMPTS)) and len(set(r.tolist())) == 3
    assert next(model.module["head"].parameters()).dtype == torch.float32
    # the file itself (what ComfyUI's file list passes) finds the CLIP file beside it
    assert torch.equal(load_reward("laion_aesthetic", path=head_file, arch=arch)(imgs, PROMPTS), r)

    # the predictor's simple_inference: clip.load("ViT-L/14") preprocess + encode_image, L2 norm, MLP
    ref_px = torch.stack([reference_clip_transform()(to_pil(x)) for x in imgs])
    assert_pixels_close(model.preprocess(imgs), ref_px)
    clip_model = open_clip.load_openai_model(os.path.join(folder, "ViT-L-14.pt"), precision="fp32", device="cpu")
    mlp = torch.nn.Sequential(torch.nn.Linear(768, 1024), torch.nn.Dropout(0.2), torch.nn.Linear(1024, 128),
                              torch.nn.Dropout(0.2), torch.nn.Linear(128, 64), torch.nn.Dropout(0.1),
                              torch.nn.Linear(64, 16), torch.nn.Linear(16, 1))
    mlp.load_state_dict({k.removeprefix("layers."): v for k, v in torch.load(head_file, weights_only=True).items()})
    with torch.no_grad():
        emb = clip_model.eval().encode_image(ref_px)
        want = mlp.eval()(emb / emb.norm(dim=-1, keepdim=True)).squeeze(-1)
    assert torch.allclose(r, want, atol=0.01) and (r.max() - r.min()) > 0.01


def test_aesthetic_missing_and_wrong_files(tmp_path):
    folder, arch = rf.make_aesthetic_folder(str(tmp_path / "a"))
    os.remove(os.path.join(folder, "ViT-L-14.pt"))
    with pytest.raises(FileNotFoundError, match=r"the CLIP ViT-L/14 weights not found in .*looked for ViT-L-14.pt, "
                                                r"open_clip_pytorch_model.bin"):
        load_reward("laion_aesthetic", path=folder, arch=arch)
    clip_file, _ = rf.make_clip_file(str(tmp_path / "b"), "open_clip", arch=arch)
    with pytest.raises(ValueError, match=r"is not the expected file \(no 'layers.0.weight'"):
        load_reward("laion_aesthetic", path=str(tmp_path / "b"), head="open_clip_pytorch_model.bin",
                    clip=clip_file, arch=arch)
    with pytest.raises(FileNotFoundError, match="the aesthetic head .*missing.pth does not exist"):
        load_reward("laion_aesthetic", path=folder, head="missing.pth", arch=arch)


# ------------------------------------------------------------------------------------------------------------
# PickScore
# ------------------------------------------------------------------------------------------------------------

def test_pickscore_matches_model_card_reference(tmp_path):
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel
    folder = rf.make_pickscore_folder(str(tmp_path / "PickScore_v1"))
    imgs = smooth_images(3, 72, 90, seed=4)
    model = load_reward("pickscore", path=folder)
    r = model(imgs, PROMPTS)
    assert r.shape == (3,) and torch.equal(r, model(imgs, PROMPTS)) and r[0] != r[1]
    assert (model.size, model.crop, model.interpolation) == (224, 224, "bicubic")
    assert model.mean == OPENAI_MEAN and model.std == OPENAI_STD
    assert torch.equal(load_reward("pickscore", path=os.path.join(folder, "config.json"))(imgs, PROMPTS), r)

    # the PickScore model card: processor(images, text, padding, truncation, max_length=77), get_*_features
    proc = os.path.join(folder, "processor")
    ip = CLIPImageProcessor.from_pretrained(proc)
    tok = AutoTokenizer.from_pretrained(proc)
    ref = CLIPModel.from_pretrained(folder).eval()
    px = ip(images=[to_pil(x) for x in imgs], return_tensors="pt")["pixel_values"]
    assert_pixels_close(model.preprocess(imgs), px)
    with torch.no_grad():
        ie = ref.get_image_features(pixel_values=px)
        te = ref.get_text_features(**tok(PROMPTS, padding=True, truncation=True, max_length=77, return_tensors="pt"))
    ie, te = [t if isinstance(t, torch.Tensor) else t.pooler_output for t in (ie, te)]  # transformers 5: outputs
    want = ref.logit_scale.exp() * (F.normalize(te, dim=-1) * F.normalize(ie, dim=-1)).sum(-1)
    assert torch.allclose(r, want, atol=0.05)
    model.preprocess = lambda x: px.to(x.device)
    try:
        assert torch.allclose(model(imgs, PROMPTS), want, atol=1e-3)
    finally:
        del model.preprocess


def test_pickscore_processor_layouts_and_errors(tmp_path):
    merged = rf.make_pickscore_folder(str(tmp_path / "merged"), processor_subdir="")
    assert load_reward("pickscore", path=merged).folders["processor"] == merged
    split = rf.make_pickscore_folder(str(tmp_path / "split"), processor_subdir="../laion-processor")
    with pytest.raises(FileNotFoundError, match="no processor files"):
        load_reward("pickscore", path=split)
    assert load_reward("pickscore", path=split, processor_path=str(tmp_path / "laion-processor")) is not None
    cfg = os.path.join(merged, "config.json")
    with open(cfg, "w") as fh:
        fh.write('{"model_type": "bert"}')
    with pytest.raises(ValueError, match="model_type is 'bert', not 'clip'"):
        load_reward("pickscore", path=merged)


# ------------------------------------------------------------------------------------------------------------
# ImageReward (full ViT-L image encoder: the slow test, ~10 s)
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_image_reward_matches_package_score(tmp_path):
    folder = rf.make_imagereward_folder(str(tmp_path / "ImageReward"), tokenizer_subdir="bert-base-uncased")
    imgs = smooth_images(2, 80, 64, seed=5)
    prompts = PROMPTS[:2]
    model = load_reward("image_reward", path=folder)
    assert model.files["tokenizer"].endswith("bert-base-uncased")
    r = model(imgs, prompts)
    assert r.shape == (2,) and r.dtype == torch.float32 and r[0] != r[1]
    model.batch_size = 1                                                    # chunked and repeated: identical
    assert torch.allclose(model(imgs, prompts), r, atol=1e-5)

    ir = model.module                                                       # the package's ImageReward
    assert (ir.mean, ir.std) == (0.16717362830052426, 1.0333394966054072)
    ref_px = ir.preprocess(to_pil(imgs[0])).unsqueeze(0)                    # its _transform(224)
    assert_pixels_close(model.preprocess(imgs[:1]), ref_px)
    with torch.no_grad():
        want = ir.score(prompts[0], to_pil(imgs[0]))                        # ImageReward.score, unchanged
    assert abs(r[0].item() - want) < 0.01
    tok = model.tokenizer(prompts[:1], padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tok.input_ids.shape == (1, 35)
    with torch.no_grad():
        exact = ir.score_gard(tok.input_ids, tok.attention_mask, ref_px).item()
    model.preprocess = lambda x: ref_px.to(x.device)
    try:
        assert abs(model(imgs[:1], prompts[:1]).item() - exact) < 1e-4
    finally:
        del model.preprocess


def test_image_reward_wrong_checkpoint(tmp_path):
    folder = tmp_path / "ir"
    folder.mkdir()
    (folder / "med_config.json").write_text("{}")
    (folder / "vocab.txt").write_text("\n".join(rf.TINY_BERT_VOCAB))
    torch.save({"state_dict": {"visual.proj": torch.zeros(2, 2)}}, folder / "ImageReward.pt")
    with pytest.raises(ValueError, match=r"ImageReward.pt is not the expected file \(no 'blip.visual_encoder.\*'"):
        load_reward("image_reward", path=str(folder))
    with pytest.raises(FileNotFoundError, match="has no vocab.txt"):
        load_reward("image_reward", path=str(folder), tokenizer_path=str(tmp_path))


# ------------------------------------------------------------------------------------------------------------
# JPEG (no weights)
# ------------------------------------------------------------------------------------------------------------

def test_jpeg_orders_flat_above_noise():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    imgs = torch.cat([flat, noise])
    comp = load_reward("jpeg_compressibility")(imgs, ["x", "x"])
    incomp = load_reward("jpeg_incompressibility")(imgs, ["x", "x"])
    assert comp[0] > comp[1] and incomp[1] > incomp[0] and torch.allclose(comp, -incomp)
    with pytest.raises(ValueError, match="needs no weight file"):
        load_reward("jpeg_compressibility", path="x.pt")


def test_config_reward_options_reach_the_loader(tmp_path):
    """A TrainConfig reward with a path and constructor options is built by the CLI's reward builder."""
    from treegrpo.config import TrainConfig
    rf.register_tiny_configs()
    path, arch = rf.make_hps_file(str(tmp_path))
    cfg = TrainConfig(prompts=["a red circle"], device="cpu",
                      rewards=[{"name": "hpsv2", "path": path, "options": {"arch": arch, "batch_size": 2}}])
    model = build_rewards(cfg, "cpu")["hpsv2"]
    assert model(torch.rand(3, 3, 32, 32), ["a", "b", "c"]).shape == (3,)


def test_pickscore_refuses_weights_that_do_not_match_its_config(tmp_path):
    """transformers would fill the weights a file lacks with random values and only warn: a partial download or
    another model's file would train on noise. The loader refuses, naming what is missing or unexpected."""
    from safetensors.torch import load_file, save_file

    folder = rf.make_pickscore_folder(str(tmp_path / "PickScore_v1"))
    weights = os.path.join(folder, "model.safetensors")
    sd = load_file(weights)
    dropped = sorted(k for k in sd if k.startswith("vision_model.encoder.layers.0."))
    save_file({k: v for k, v in sd.items() if k not in dropped}, weights)
    with pytest.raises(ValueError, match="missing .*vision_model.encoder.layers.0") as e:
        load_reward("pickscore", path=folder)
    assert "incomplete download or another model" in str(e.value)
    save_file({**sd, "extra.weight": sd[dropped[0]].clone()}, weights)
    with pytest.raises(ValueError, match="unexpected 1 .*extra.weight"):
        load_reward("pickscore", path=folder)
    save_file(sd, weights)
    with open(os.path.join(folder, "pytorch_model.bin"), "w") as fh:   # a file transformers would not read: left be
        fh.write("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")
    load_reward("pickscore", path=folder)
    with open(weights, "w") as fh:     # the model page saved by a browser in place of the file
        fh.write("<!doctype html><html><head><title>yuvalkirstain/PickScore_v1</title>")
    with pytest.raises(ValueError, match=r"pickscore: .*model.safetensors is a web page \(HTML\), not the weights"):
        load_reward("pickscore", path=folder)


def test_clipscore_reads_the_open_clip_config_beside_the_weights(tmp_path):
    """LAION weights are trained with GELU, OpenAI's with QuickGELU, and the file does not say which. open_clip's hub
    layout puts ``open_clip_config.json`` beside the weights: its ``quick_gelu`` and ``preprocess_cfg`` are used
    (explicit options still win); an unreadable one is named."""
    import json

    from open_clip.transformer import QuickGELU

    path, arch = rf.make_clip_file(str(tmp_path), "safetensors", arch=rf.TINY_HPS)   # an architecture with GELU

    def act(model):
        return type(model.module.visual.transformer.resblocks[0].mlp.gelu)

    assert act(load_reward("clipscore", path=path, arch=arch)) is QuickGELU          # pretrained='openai'
    cfg = {"model_cfg": {"quick_gelu": False}, "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}
    (tmp_path / "open_clip_config.json").write_text(json.dumps(cfg))
    laion = load_reward("clipscore", path=path, arch=arch)
    assert act(laion) is torch.nn.GELU and tuple(laion.pre["mean"]) == (0.5, 0.5, 0.5)
    assert act(load_reward("clipscore", path=path, arch=arch, quick_gelu=True)) is QuickGELU
    (tmp_path / "open_clip_config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="open_clip_config.json .*not a readable open_clip config"):
        load_reward("clipscore", path=path, arch=arch)


# ------------------------------------------------------------------------------------------------------------
# download layouts: Hub cache folders, companions in subfolders or sibling downloads
# ------------------------------------------------------------------------------------------------------------

def _as_hub_cache(src: str, cache_root: str, repo: str, commit: str = "0123abc") -> str:
    """Move a model folder into the layout ``huggingface-cli download`` leaves without --local-dir."""
    import shutil
    repo_dir = os.path.join(cache_root, "models--" + repo.replace("/", "--"))
    os.makedirs(os.path.join(repo_dir, "refs"))
    os.makedirs(os.path.join(repo_dir, "snapshots"))
    shutil.move(src, os.path.join(repo_dir, "snapshots", commit))
    with open(os.path.join(repo_dir, "refs", "main"), "w") as fh:
        fh.write(commit)
    return repo_dir


def test_pickscore_finds_hub_cache_and_sibling_processor_downloads(tmp_path):
    root = tmp_path / "reward_models"
    split = rf.make_pickscore_folder(str(root / "PickScore_v1"), processor_subdir="../CLIP-ViT-H-14-laion2B-s32B-b79K")
    r = load_reward("pickscore", path=split)
    assert r.folders["processor"] == str(root / "CLIP-ViT-H-14-laion2B-s32B-b79K")
    # both as Hub cache folders: the model folder given, the processor found beside it by its Hub name
    cache = tmp_path / "hub"
    model_repo = _as_hub_cache(split, str(cache), "yuvalkirstain/PickScore_v1")
    _as_hub_cache(str(root / "CLIP-ViT-H-14-laion2B-s32B-b79K"), str(cache), "laion/CLIP-ViT-H-14-laion2B-s32B-b79K")
    r2 = load_reward("pickscore", path=model_repo)
    assert r2.folders["model"].endswith(os.path.join("snapshots", "0123abc"))
    assert "models--laion--CLIP-ViT-H-14" in r2.folders["processor"]


def test_aesthetic_finds_its_clip_in_a_subfolder(tmp_path):
    import shutil
    folder, arch = rf.make_aesthetic_folder(str(tmp_path / "aesthetic"))
    imgs = smooth_images(2, 64, 64, seed=4)
    want = load_reward("laion_aesthetic", path=folder, arch=arch)(imgs, PROMPTS[:2])
    os.makedirs(os.path.join(folder, "clip-vit-large-patch14"))
    shutil.move(os.path.join(folder, "ViT-L-14.pt"), os.path.join(folder, "clip-vit-large-patch14", "ViT-L-14.pt"))
    model = load_reward("laion_aesthetic", path=folder, arch=arch)
    assert model.files["clip"].endswith(os.path.join("clip-vit-large-patch14", "ViT-L-14.pt"))
    assert torch.equal(model(imgs, PROMPTS[:2]), want)


@pytest.mark.slow
def test_image_reward_sibling_tokenizer_and_a_wrong_med_config_is_blamed(tmp_path):
    import json
    root = tmp_path / "reward_models"
    folder = rf.make_imagereward_folder(str(root / "ImageReward"), tokenizer_subdir="../bert-base-uncased")
    model = load_reward("image_reward", path=folder)
    assert model.files["tokenizer"] == str(root / "bert-base-uncased")
    med = os.path.join(folder, "med_config.json")
    cfg = json.load(open(med))
    json.dump(dict(cfg, hidden_size=512, num_hidden_layers=cfg["num_hidden_layers"] + 2), open(med, "w"))
    with pytest.raises(ValueError) as e:
        load_reward("image_reward", path=folder)
    msg = str(e.value)
    assert "med_config.json is not the expected file" in msg and "hidden_size 512 (the checkpoint's is 768)" in msg
    assert "num_hidden_layers" in msg and "ImageReward.pt is not" not in msg


def test_the_rewards_command_says_what_each_needs(capsys, monkeypatch):
    """``treegrpo rewards`` printed names only (a user's walk): each name now comes with what its ``path`` must hold,
    and, where an optional package it needs is missing, the line that installs it."""
    import treegrpo.deps as deps
    from treegrpo import cli
    from treegrpo.rewards.base import available

    monkeypatch.setattr(deps, "_importable", lambda m: m != "onnxruntime")
    assert cli.main(["rewards"]) == 0
    out = capsys.readouterr().out
    names = [ln for ln in out.splitlines() if ln and not ln.startswith(" ")]
    assert names == available()
    block = out.split("\nocr\n", 1)[1].split("\npickscore\n", 1)[0]
    assert "path: none" in block and "not installed:" in block and "pip install onnxruntime" in block, block
    assert "path: one file: HPS_v2.1_compressed.pt" in out and "path: <run_name>_taste.safetensors" in out
