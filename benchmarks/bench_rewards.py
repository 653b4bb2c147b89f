"""Reward model throughput: images/second of each scorer at batch 8 and 32 (issue: reward models).

Each model is built at its published size with random weights (tests/reward_fixtures.py: ViT-H-14 for
HPS v2.1 and PickScore, CLIP ViT-L/14 for the aesthetic predictor and CLIPScore, BLIP ViT-L + BERT-base
for ImageReward), saved in the file layout a user has, loaded through ``load_reward`` and timed on
512×512 images (preprocessing included: resize, crop/pad, normalise, tokenise; results copied back to the
CPU). On a GPU (used when present) the models run in their default half precision (float16) and each
batch size is timed 5 times after a warm-up; on the CPU, float32, one timed call after a small warm-up.

    python benchmarks/bench_rewards.py [--models hpsv2 pickscore ...] [--batches 8 32] [--threads 1]
                                       [--size real|tiny] [--out benchmarks/results/rewards.json]
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402

import reward_fixtures as rf  # noqa: E402
from treegrpo.io import atomic_write_json  # noqa: E402
from treegrpo.rewards.base import load_reward  # noqa: E402

MODELS = ["jpeg_compressibility", "laion_aesthetic", "clipscore", "hpsv2", "pickscore", "image_reward", "ocr",
          "vlm_judge", "hpsv3"]
ARCH = {"hpsv2": "ViT-H-14", "pickscore": "ViT-H-14 (transformers)", "laion_aesthetic": "ViT-L-14 image tower + MLP",
        "clipscore": "ViT-L-14", "image_reward": "BLIP ViT-L + BERT-base (12 layers)", "jpeg_compressibility": "-",
        "ocr": "PP-OCRv4 det + rec (ONNX, the real models)", "vlm_judge": "Qwen2-VL", "hpsv3": "Qwen2-VL-7B + head"}
#: built only at the tiny size here: their published sizes (2-7 B parameters) need a GPU's memory
GPU_ONLY = ("vlm_judge", "hpsv3")


def build(name: str, folder: str, size: str, device: str):
    """(reward model, seconds to write the files, seconds to load them)."""
    t0 = time.perf_counter()
    kw = {}
    if name == "hpsv2":
        path, arch = rf.make_hps_file(folder, size)
        kw["arch"] = arch
    elif name == "clipscore":
        path, arch = rf.make_clip_file(folder, "torchscript", size)
        kw["arch"] = arch
    elif name == "laion_aesthetic":
        path, arch = rf.make_aesthetic_folder(folder, size)
        kw["arch"] = arch
    elif name == "pickscore":
        path = rf.make_pickscore_folder(folder, size)
    elif name == "image_reward":
        path = rf.make_imagereward_folder(folder, bert_layers=2 if size == "tiny" else 12)
    elif name in GPU_ONLY:
        if size != "tiny":
            raise SystemExit(f"{name}: the published model has billions of parameters; time it on a GPU with its "
                             "real files, or here with --size tiny (the computation only)")
        path = rf.make_qwen2vl_folder(folder) if name == "vlm_judge" else rf.make_hpsv3_folder(folder)
    else:
        path = None
    t1 = time.perf_counter()
    model = load_reward(name, path=path, device=device, **kw)
    return model, t1 - t0, time.perf_counter() - t1


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def text_images(n: int, res: int) -> torch.Tensor:
    """(n, 3, res, res) pictures with a word drawn in them (what the OCR reward reads; noise it skips early)."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    words = ["OPEN", "COFFEE", "SALE", "HOTEL"]
    out = []
    for i in range(n):
        im = Image.new("RGB", (res, res), (235, 230, 215))
        ImageDraw.Draw(im).text((res // 2, res // 2), words[i % 4], fill=(20, 20, 20),
                                font=ImageFont.load_default(size=res // 8), anchor="mm")
        out.append(torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1))
    return torch.stack(out)


def time_batches(model, batches, device, res, repeat, name=""):
    g = torch.Generator().manual_seed(0)
    prompts_pool = ["a photo of a cat on a sofa", "an oil painting of a lighthouse at sunset",
                    "a red sports car in the rain", "a bowl of ramen, studio lighting"]
    if name == "ocr":
        prompts_pool = [f'a sign that says "{w}"' for w in ("OPEN", "COFFEE", "SALE", "HOTEL")]
    draw = (lambda b: text_images(b, res)) if name == "ocr" else (lambda b: torch.rand(b, 3, res, res, generator=g))
    rows = []
    warm = draw(2)
    model(warm.to(device), prompts_pool[:2])
    sync(device)
    for b in batches:
        imgs = draw(b).to(device)
        prompts = [prompts_pool[i % 4] for i in range(b)]
        if repeat > 1:
            model(imgs, prompts)
            sync(device)
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = model(imgs, prompts)
            sync(device)
            ts.append(time.perf_counter() - t0)
        assert out.shape == (b,) and torch.isfinite(out).all()
        t = sorted(ts)[len(ts) // 2]
        rows.append({"batch": b, "seconds": t, "images_per_s": b / t})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for torch (the benchmark machine is shared)")
    ap.add_argument("--size", choices=["real", "tiny"], default="real")
    ap.add_argument("--res", type=int, default=512, help="side of the square input images")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "rewards.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    repeat = 5 if a.device.startswith("cuda") else 1
    machine = {"device": a.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None}
    results = {"machine": machine, "size": a.size, "input_resolution": a.res, "rows": []}
    where = machine["gpu"] or f"{machine['threads']} CPU thread(s)"
    print(f"device {a.device} ({where}), {a.size} sizes, {a.res}x{a.res} inputs")
    print(f"{'model':22s} {'architecture':36s} {'dtype':9s} " + " ".join(f"{'b=' + str(b) + ' img/s':>11s}" for b in a.batches))
    for name in a.models:
        folder = tempfile.mkdtemp(prefix=f"bench-{name}-")
        try:
            model, t_write, t_load = build(name, folder, a.size, a.device)
            rows = time_batches(model, a.batches, a.device, a.res, repeat, name)
            dtype = str(getattr(model, "dtype", "-")).replace("torch.", "")
            params = sum(p.numel() for p in model.module.parameters()) if hasattr(model, "module") else 0
            arch = ARCH[name] if a.size == "real" or name.startswith("jpeg") or name == "ocr" else "tiny test config"
            results["rows"].append({"model": name, "architecture": arch, "dtype": dtype, "params": params,
                                    "load_s": t_load, "write_files_s": t_write, "batches": rows})
            print(f"{name:22s} {arch:36s} {dtype:9s} " + " ".join(f"{r['images_per_s']:11.2f}" for r in rows),
                  flush=True)
            del model
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            gc.collect()
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
    atomic_write_json(a.out, results)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
