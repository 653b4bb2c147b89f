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

import torch  # noqa: E402

import reward_fixtures as rf  # noqa: E402
from treegrpo.io import atomic_write_json  # noqa: E402
from treegrpo.rewards.base import load_reward  # noqa: E402

MODELS = ["jpeg_compressibility", "laion_aesthetic", "clipscore", "hpsv2", "pickscore", "image_reward", "ocr",
          "vlm_judge", "hpsv3"]
ARCH = {"hpsv2": "ViT-H-14", "pickscore": "ViT-H-14 (transformers)", "laion_aesthetic": "ViT-L-14 image tower + MLP",
        "clipscore": "ViT-L-14", "image_reward": "BLIP ViT-L + BERT-base (12 layers)", "jpeg_compressibility": "-",
        "ocr": "PP-OCRv6 det + rec (ONNX, the real models)", "vlm_judge": "Qwen2-VL", "hpsv3": "Qwen2-VL-7B + head"}
#: billions of parameters: at --size real built at their published widths with a few layers, timed at two depths,
#: and composed to the published depth (:func:`time_published_vlm`)
GPU_ONLY = ("vlm_judge", "hpsv3")
PUBLISHED = {"vlm_judge": "2b", "hpsv3": "7b"}     # the judge's smallest Qwen2-VL; HPSv3 is Qwen2-VL-7B


def build(name: str, folder: str, size: str, device: str, threads: int = 1):
    """(reward model, seconds to write the files, seconds to load them); ``threads``: the OCR reward's ONNX threads."""
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
        depth = {} if size == "tiny" else {"size": PUBLISHED[name], "text_layers": int(size), "vision_depth": int(size)}
        path = rf.make_qwen2vl_folder(folder, **depth) if name == "vlm_judge" else rf.make_hpsv3_folder(folder, **depth)
    else:
        path = None
        if name == "ocr":
            kw["threads"] = threads
    t1 = time.perf_counter()
    model = load_reward(name, path=path, device=device, **kw)
    return model, t1 - t0, time.perf_counter() - t1


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def text_images(n: int, res: int) -> torch.Tensor:
    """(n, 3, res, res) pictures with a word drawn in them (what the OCR reward reads; noise it skips early)."""
    words = ["OPEN", "COFFEE", "SALE", "HOTEL"]
    return torch.stack([rf.drawn_text(words[i % 4], None, res // 8, res) for i in range(n)])


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


def published_params(name: str) -> int:
    """Parameters of the published model (built on the meta device: no memory), the HPSv3 head included."""
    from transformers import Qwen2VLForConditionalGeneration

    ids = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                                       "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])}
    cfg = rf.qwen2vl_config(PUBLISHED[name], ids, 0)
    if name == "hpsv3":
        cfg.text_config.vocab_size = 151658
    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen2VLForConditionalGeneration(cfg).parameters())
    if name == "hpsv3":
        from treegrpo.rewards.hpsv3 import ranknet_head
        with torch.device("meta"):
            n += sum(p.numel() for p in ranknet_head(cfg.text_config.hidden_size).parameters())
    return n


def time_published_vlm(name: str, depths: list[int], batch: int, device: str, res: int, repeats: int = 3) -> dict:
    """A Qwen2-VL reward at its published widths: built with ``d`` text layers and ``d`` vision blocks for each ``d``
    in ``depths`` (two of them), loaded through ``load_reward``; the whole scoring call and the vision tower alone
    timed on ``batch`` images (the median of ``repeats`` calls). Per layer: the difference between the depths; the published depth (28 text layers,
    32 vision blocks): the smaller build's time plus the layers it lacks. Peak memory of the scoring call's tensors
    (activations, not the weights) measured at each depth; the weights' bytes from the published parameter count."""
    from treegrpo import memory

    full = rf.QWEN2VL_PUBLISHED[PUBLISHED[name]]
    L_text, L_vis = full["text"]["num_hidden_layers"], full["vision"]["depth"]
    g = torch.Generator().manual_seed(0)
    imgs = torch.rand(batch, 3, res, res, generator=g)
    prompts = ["a photo of a cat on a sofa", "a red sports car in the rain"] * batch
    prompts = prompts[:batch]
    at = {}
    for d in depths:
        folder = tempfile.mkdtemp(prefix=f"bench-{name}-{d}-")
        try:
            model, t_write, t_load = build(name, folder, str(d), device)
            model(imgs[:1], prompts[:1])                       # warm-up

            def timed(fn):
                """The median of ``repeats`` timed calls (s): one call is noisy, and the composition multiplies
                the difference between two depths by up to 30 layers."""
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    out = fn()
                    ts.append(time.perf_counter() - t0)
                return sorted(ts)[len(ts) // 2], out

            total, out = timed(lambda: model(imgs, prompts))
            assert out.shape == (batch,) and torch.isfinite(out).all()
            with torch.no_grad():
                vision, _ = timed(lambda: model.image_features(imgs))
            peak = memory.peak_of(model, lambda: (imgs, prompts), fake=False)
            at[d] = {"total_s": total, "vision_s": vision, "activation_peak_bytes": peak, "load_s": t_load,
                     "write_files_s": t_write, "dtype": str(model.dtype).replace("torch.", "")}
            print(f"  {name} at depth {d}: {total:.1f} s for {batch} images (vision {vision:.1f} s), "
                  f"activations {peak / 2**20:.0f} MiB", flush=True)
            del model
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            gc.collect()
    d1, d2 = sorted(at)[:2]
    a, b = at[d1], at[d2]
    per_vis = (b["vision_s"] - a["vision_s"]) / (d2 - d1)
    per_text = ((b["total_s"] - b["vision_s"]) - (a["total_s"] - a["vision_s"])) / (d2 - d1)
    composed = a["total_s"] + (L_text - d1) * per_text + (L_vis - d1) * per_vis
    params = published_params(name)
    return {"model": name, "architecture": ARCH[name] + f" at the published widths ({PUBLISHED[name]}), timed with "
            f"{d1} and {d2} of {L_text} text layers / {L_vis} vision blocks, composed to the published depth",
            "dtype": a["dtype"], "params": params, "weights_bytes_bf16": 2 * params,
            "by_depth": {str(k): v for k, v in at.items()}, "per_text_layer_s": per_text / batch,
            "per_vision_block_s": per_vis / batch, "seconds_per_image": composed / batch,
            "batches": [{"batch": batch, "seconds": composed, "images_per_s": batch / composed}]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch and the OCR reward's ONNX Runtime (the benchmark machine is shared)")
    ap.add_argument("--size", choices=["real", "tiny"], default="real")
    ap.add_argument("--res", type=int, default=512, help="side of the square input images")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vlm-depths", default="2,4", help="--size real: the two depths the Qwen2-VL rewards are built "
                    "at (text layers = vision blocks) to compose the published depth from")
    ap.add_argument("--vlm-batch", type=int, default=2, help="--size real: images per timed call of the Qwen2-VL rewards")
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
        if name in GPU_ONLY and a.size == "real":
            depths = [int(x) for x in a.vlm_depths.split(",")]
            row = time_published_vlm(name, depths, a.vlm_batch, a.device, 448)
            results["rows"].append(row)
            print(f"{name:22s} {'Qwen2-VL ' + PUBLISHED[name] + ' (composed)':36s} {row['dtype']:9s} "
                  f"{row['seconds_per_image']:8.1f} s/image, weights {row['weights_bytes_bf16'] / 1e9:.1f} GB bf16",
                  flush=True)
            continue
        folder = tempfile.mkdtemp(prefix=f"bench-{name}-")
        try:
            model, t_write, t_load = build(name, folder, a.size, a.device, a.threads)
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
