"""Regenerate the shipped UI-format workflows from compact specs, using the live node registry of a real
ComfyUI (the one the tests extract) for input order, widget order and socket types.

    python workflows/generate.py            # writes workflows/*.json

Each spec node: ``(key, class_type, {widget: value}, {input: (source_key, output_slot)})``; ``Note`` nodes
carry the user-facing instructions (which model files go where).  Nodes are laid out in columns by link depth
with sizes estimated from their slots and widgets (no overlaps; checked in the browser by
tests/browser/test_browser.py) and coloured by menu category (``CATEGORY_COLORS``).  After a change, redraw the
template-browser thumbnails: ``python workflows/make_thumbnails.py``.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from treegrpo.demo.config import DEMO_RUN  # noqa: E402
from treegrpo.demo.shapes import all_prompts  # noqa: E402

DEMO_PROMPTS = "\n".join(all_prompts())


def note(key, text):
    return (key, "Note", {"text": text}, {})


def train_node(key, model, clip, vae, reward, judge=None, links=None, **w):
    widgets = {"prompts": DEMO_PROMPTS, "negative": "", "weight_2": 1.0, "width": 16, "height": 16, "cfg": 1.0,
               "scheduler": "simple", "steps": 10, "window_start": 1, "window_width": 3, "branch": 2,
               "noise_level": 0.7, "iterations": 40, "prompts_per_iteration": 4, "lora_rank": 8, "lora_alpha": 16.0,
               "learning_rate": 3e-3, "seed": 0, "run_name": "treegrpo_demo", "eval_every": 10}
    widgets.update(w)
    links = {"model": model, "clip": clip, "vae": vae, "reward_model": reward, **(links or {})}
    if judge is not None:
        links["judge"] = judge
    return (key, "TreeGRPOTrain", widgets, links)


HPS_TEXT = ("Reward: HPS v2.1 — HPS_v2.1_compressed.pt (HPSv2 project, github.com/tgxs002/HPSv2, Hugging Face "
            "xswu/HPSv2; Apache-2.0) into ComfyUI/models/reward_models/.")
OCR_TEXT = ("Reward: ocr — how much of the text the prompt quotes (a sign that says \"OPEN\") RapidOCR's PP-OCRv6 "
            "models read in the image: 1 − edit distance / text length, case and spaces ignored. No file: the models "
            "come inside the package. Install once into ComfyUI's Python: pip install onnxruntime pyclipper shapely "
            "omegaconf colorlog && pip install --no-deps rapidocr==3.10.0 (without onnxruntime where another pack "
            "brought onnxruntime-gpu or another build of it; OpenCV too if no other pack brought it: pip install "
            "opencv-python-headless). Every prompt must quote its text.")


def real_model_workflow(loader_nodes, model, clip, vae, size, reward_note, *, run_name, steps=20, cfg=4.5,
                        extra_note="", height=None, negative="blurry, low quality", prompts=None,
                        prompt_file="treegrpo/general_subjects.txt", preset="balanced", reward=None,
                        reward_text=None, **train):
    """A real-model Train workflow. Each has its own ``run_name`` (its run folder, its LoRA folder
    ``models/loras/treegrpo/<run_name>/`` and the Save LoRA prefix), so that workflows queued one after another never
    meet. Prompts come from ``prompt_file`` through the Prompt List (4 held out for evaluation) unless ``prompts``
    is given."""
    plist = [] if prompts else [("plist", "TreeGRPOPromptList", {"file": prompt_file, "eval_count": 4, "seed": 0}, {})]
    links = {} if prompts else {"prompts": ("plist", 0), "eval_prompts": ("plist", 1)}
    return [
        *loader_nodes,
        *plist,
        ("rm", "TreeGRPORewardModelLoader", reward or {"reward": "hpsv2", "file": "HPS_v2.1_compressed.pt"}, {}),
        train_node("train", model, clip, vae, ("rm", 0), links=links,
                   prompts=prompts or "(from the Prompt List)", width=size, height=height or size,
                   steps=steps, cfg=cfg, window_start=1, window_width=3, iterations=200, prompts_per_iteration=2,
                   lora_rank=32, lora_alpha=64.0, learning_rate=3e-4, run_name=run_name, eval_every=20,
                   negative=negative, gradient_checkpointing="auto", existing_run="resume", kl_beta=0.1,
                   save_every=50, preset=preset, **train),  # real sizes: the memory plan decides
        ("save", "TreeGRPOSaveLoRA", {"filename_prefix": f"treegrpo/{run_name}/{run_name}_saved"},
         {"lora": ("train", 1)}),
        ("curve", "PreviewImage", {}, {"images": ("train", 2)}),
        ("grid", "PreviewImage", {}, {"images": ("train", 3)}),
        note("n1", "TreeGRPO LoRA training.\n" + reward_note + "\n" + (reward_text or HPS_TEXT) + " The Reward Model "
             "Loader's tooltip lists every reward's files, where they come from and their licence; its file list shows "
             "the files that can be the chosen reward.\n"
             + ("Prompts: typed in the Train node, one a line; the evaluation uses them too. For a prompt file and "
                "prompts held out for evaluation, connect a Prompt List's prompts and eval_prompts to the Train node."
                if prompts else
                "Prompts: the Prompt List reads a .txt/.csv/.jsonl file from ComfyUI/input/ (or a set the pack ships) "
                "and holds 4 prompts out for evaluation.") + "\nRuns: run_name " + run_name + " — its LoRAs appear in LoraLoader "
             "under treegrpo/" + run_name + "/ (every save_every iterations, the best by the judge, the last); "
             "checkpoints, logs and every evaluation's sample grid in output/treegrpo/" + run_name + "/. Queue it "
             "again to resume; after changing a setting set existing_run to new (a numbered run beside this one) or "
             "overwrite (its files and LoRAs moved to previous-<time>/). Stop with Cancel: a checkpoint is saved first. The "
             "console prints one line per iteration (reward, judge, KL, s/it, time left).\n"
             "Preset " + preset + ": the leaves' ODE tail. fast = 2 DPM++ 2M steps, balanced = 6, paper = every "
             "remaining Euler step (the most exact leaves, 2-5x the sampling of balanced); never more steps than "
             "the schedule leaves after the window; custom = tail_solver and tail_steps as set.\nMemory: before any "
             "work the "
             "Train node plans for your GPU (gradient checkpointing, microbatch, reward model offload) and logs the "
             "planned peak; if nothing fits it stops and says what to change. Predicted peaks (not yet measured on a "
             "GPU) at these settings: SD1.5 @512 3.9 GB, SDXL @1024 9.3 GB, SD3.5-Medium @1024 7.5 GB, Flux.1-dev "
             "fp8 @1024 16.1 GB." + extra_note),
    ]


WORKFLOWS = {
    "treegrpo_demo_cpu": [
        ("demo", "TreeGRPOLoadDemoModel", {}, {}),
        ("rm", "TreeGRPORewardModelLoader", {"reward": "demo_adherence", "file": "(none: built-in weights or none needed)"}, {}),
        ("judge", "TreeGRPORewardModelLoader", {"reward": "demo_judge", "file": "(none: built-in weights or none needed)"}, {}),
        # the settings of `treegrpo demo` (treegrpo.demo.config.DEMO_RUN: the configuration the budget runs
        # measured best on the demo)
        train_node("train", ("demo", 0), ("demo", 1), ("demo", 2), ("rm", 0), judge=("judge", 0),
                   iterations=DEMO_RUN["iterations"], prompts_per_iteration=DEMO_RUN["prompts_per_iter"],
                   eval_every=DEMO_RUN["eval_every"], learning_rate=DEMO_RUN["optim"]["lr"], tail_solver="dpmpp_2m",
                   tail_steps=DEMO_RUN["tree"]["tail_steps"],
                   tail_steps_schedule=json.dumps(DEMO_RUN["tree"]["tail_steps_schedule"]),
                   lr_factor_schedule=json.dumps(DEMO_RUN["optim"]["lr_factor_schedule"])),
        ("save", "TreeGRPOSaveLoRA", {"filename_prefix": "treegrpo/treegrpo_demo"}, {"lora": ("train", 1)}),
        ("curve", "PreviewImage", {}, {"images": ("train", 2)}),
        ("grid", "PreviewImage", {}, {"images": ("train", 3)}),
        ("pos", "CLIPTextEncode", {"text": "a magenta triangle"}, {"clip": ("demo", 1)}),
        ("neg", "CLIPTextEncode", {"text": ""}, {"clip": ("demo", 1)}),
        ("empty", "EmptyImage", {"width": 16, "height": 16, "batch_size": 2, "color": 0}, {}),
        ("lat", "VAEEncode", {}, {"pixels": ("empty", 0), "vae": ("demo", 2)}),
        ("tree", "TreeGRPOTreeSampler", {"seed": 1, "cfg": 1.0, "scheduler": "simple", "steps": 10, "window_start": 1,
                                         "window_width": 3, "branch": 2, "noise_level": 0.7, "trees_per_latent": 1,
                                         "prompt": "a magenta triangle"},
         {"model": ("train", 0), "positive": ("pos", 0), "negative": ("neg", 0), "latent": ("lat", 0)}),
        ("dec", "VAEDecode", {}, {"samples": ("tree", 1), "vae": ("demo", 2)}),
        ("score", "TreeGRPORewardScorer", {"prompt": "a magenta triangle", "weight": 1.0},
         {"images": ("dec", 0), "reward_model": ("rm", 0)}),
        ("adv", "TreeGRPOAdvantageBackup", {"backup": "softmax", "temperature": 1.0, "adv_clip": 5.0, "flat_floor": 0.001},
         {"tree": ("tree", 0), "rewards": ("score", 0)}),
        ("preview", "TreeGRPOTreePreview", {}, {"tree": ("adv", 0), "images": ("dec", 0), "rewards": ("score", 0)}),
        note("n1", "TreeGRPO on the embedded demo model (no downloads; about a minute on a 2-core CPU).\n"
             "TreeGRPO Train runs the whole loop, 180 iterations of 12 prompts: trees of k=2, w=3 (8 leaves) per "
             "prompt with a 1-step DPM++ 2M tail (2 steps from iteration 60; the learning rate halves at iteration "
             "100), scored by a small "
             "classifier of prompt adherence. Outputs: reward curve, samples with the LoRA, the LoRA itself "
             "(saved to models/loras/treegrpo/). The lower branch samples one tree with the trained model and "
             "shows its leaves with rewards and advantages."),
    ],
    "treegrpo_step_by_step": [
        ("demo", "TreeGRPOLoadDemoModel", {}, {}),
        ("run", "TreeGRPOTrainerState", {"run_name": "treegrpo_steps", "lora_rank": 8, "lora_alpha": 16.0,
                                         "learning_rate": 3e-3, "clip_range": 1e-4, "kl_beta": 0.1, "seed": 0}, {}),
        ("prompt", "PrimitiveString", {"value": "a blue cross"}, {}),
        ("pos", "CLIPTextEncode", {"text": "a blue cross"}, {"clip": ("demo", 1), "text": ("prompt", 0)}),
        ("neg", "CLIPTextEncode", {"text": ""}, {"clip": ("demo", 1)}),
        ("empty", "EmptyImage", {"width": 16, "height": 16, "batch_size": 4, "color": 0}, {}),
        ("lat", "VAEEncode", {}, {"pixels": ("empty", 0), "vae": ("demo", 2)}),
        ("tree", "TreeGRPOTreeSampler", {"seed": 0, "cfg": 1.0, "scheduler": "simple", "steps": 10, "window_start": 1,
                                         "window_width": 3, "branch": 2, "noise_level": 0.7, "trees_per_latent": 1,
                                         "prompt": "a blue cross"},
         {"model": ("demo", 0), "positive": ("pos", 0), "negative": ("neg", 0), "latent": ("lat", 0), "run": ("run", 0),
          "prompt": ("prompt", 0)}),
        ("dec", "VAEDecode", {}, {"samples": ("tree", 1), "vae": ("demo", 2)}),
        ("rm", "TreeGRPORewardModelLoader", {"reward": "demo_adherence", "file": "(none: built-in weights or none needed)"}, {}),
        ("score", "TreeGRPORewardScorer", {"prompt": "a blue cross", "weight": 1.0},
         {"images": ("dec", 0), "reward_model": ("rm", 0), "prompt": ("prompt", 0)}),
        ("adv", "TreeGRPOAdvantageBackup", {"backup": "softmax", "temperature": 1.0, "adv_clip": 5.0, "flat_floor": 0.001},
         {"tree": ("tree", 0), "rewards": ("score", 0)}),
        ("step", "TreeGRPOTrainerStep", {}, {"tree": ("adv", 0), "run": ("run", 0), "model": ("demo", 0)}),
        ("preview", "TreeGRPOTreePreview", {}, {"tree": ("adv", 0), "images": ("dec", 0), "rewards": ("score", 0)}),
        ("judge", "TreeGRPORewardModelLoader", {"reward": "demo_judge", "file": "(none: built-in weights or none needed)"}, {}),
        ("monitor", "TreeGRPORunMonitor", {}, {"tree": ("adv", 0), "images": ("dec", 0), "rewards": ("score", 0),
                                               "judge": ("judge", 0)}),
        note("n1", "The four TreeGRPO step nodes, one iteration per Queue. Turn on auto-queue to watch the LoRA "
             "learn: each queued prompt is the run's next iteration (its noise comes from the seed and the iteration, "
             "as in the Train node, which these nodes reproduce exactly). The Trainer State keeps the LoRA and "
             "optimiser between runs and saves them in output/treegrpo/treegrpo_steps/; after each step the LoRA is "
             "also models/loras/treegrpo/treegrpo_steps/treegrpo_steps.safetensors, which LoraLoader lists (TreeGRPO "
             "Save LoRA on the Trainer Step's lora output keeps a numbered copy). The String node holds the prompt: "
             "it feeds CLIPTextEncode, the Tree Sampler and the Reward Scorer alike."),
    ],
    "treegrpo_artist_demo_cpu": [
        ("demo", "TreeGRPOLoadDemoModel", {}, {}),
        ("run", "TreeGRPOTrainerState", {"run_name": "treegrpo_artist", "lora_rank": 8, "lora_alpha": 16.0,
                                         "learning_rate": 1e-3, "clip_range": 1e-4, "kl_beta": 0.1, "seed": 0}, {}),
        ("prompt", "PrimitiveString", {"value": "a red circle"}, {}),
        ("pos", "CLIPTextEncode", {"text": "a red circle"}, {"clip": ("demo", 1), "text": ("prompt", 0)}),
        ("neg", "CLIPTextEncode", {"text": ""}, {"clip": ("demo", 1)}),
        ("empty", "EmptyImage", {"width": 16, "height": 16, "batch_size": 2, "color": 0}, {}),
        ("lat", "VAEEncode", {}, {"pixels": ("empty", 0), "vae": ("demo", 2)}),
        ("tree", "TreeGRPOTreeSampler", {"seed": 0, "cfg": 1.0, "scheduler": "simple", "steps": 10, "window_start": 1,
                                         "window_width": 2, "branch": 2, "noise_level": 0.9, "trees_per_latent": 1,
                                         "prompt": "a red circle"},
         {"model": ("demo", 0), "positive": ("pos", 0), "negative": ("neg", 0), "latent": ("lat", 0), "run": ("run", 0),
          "prompt": ("prompt", 0)}),
        ("dec", "VAEDecode", {}, {"samples": ("tree", 1), "vae": ("demo", 2)}),
        ("picks", "TreeGRPOArtistPicks", {"mode": "favourites", "timeout_s": 600, "on_timeout": "skip the tree"},
         {"images": ("dec", 0), "tree": ("tree", 0)}),
        ("adv", "TreeGRPOAdvantageBackup", {"backup": "softmax", "temperature": 1.0, "adv_clip": 5.0, "flat_floor": 0.0},
         {"tree": ("tree", 0), "rewards": ("picks", 0)}),
        ("step", "TreeGRPOTrainerStep", {}, {"tree": ("adv", 0), "run": ("run", 0), "model": ("demo", 0)}),
        ("preview", "TreeGRPOTreePreview", {}, {"tree": ("adv", 0), "images": ("dec", 0), "rewards": ("picks", 0)}),
        ("save", "TreeGRPOSaveLoRA", {"filename_prefix": "treegrpo/treegrpo_artist"}, {"lora": ("step", 1)}),
        note("n1", "You are the reward: teach the embedded demo model a taste of your own (no downloads, CPU). Each "
             "Queue samples 2 trees of 4 leaves for 'a red circle' and shows them to you, siblings side by side: click "
             "the ones you like (shift-click the ones you dislike), Enter sends, 0 = no preference, Esc skips the "
             "tree, Z zooms. Pick, say, the bigger or the brighter circles and turn on auto-queue (or set the Run button's batch count): the "
             "samples lean your way after about 15 answers, 8 queued prompts. Every answer is kept in "
             "output/treegrpo/treegrpo_artist/artist_labels.jsonl. With a real model: replace the demo loader by "
             "Load Checkpoint, CLIP Text Encode and its VAE, as in the other workflows."),
    ],
    "treegrpo_sd15_lora": real_model_workflow(
        [("ckpt", "CheckpointLoaderSimple", {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}, {})],
        ("ckpt", 0), ("ckpt", 1), ("ckpt", 2), 512,
        "Model: put v1-5-pruned-emaonly.safetensors (or any SD1.x checkpoint) into ComfyUI/models/checkpoints/.",
        run_name="treegrpo_sd15", steps=20, cfg=4.5),
    "treegrpo_sdxl_lora": real_model_workflow(
        [("ckpt", "CheckpointLoaderSimple", {"ckpt_name": "sd_xl_base_1.0.safetensors"}, {})],
        ("ckpt", 0), ("ckpt", 1), ("ckpt", 2), 1024,
        "Model: put sd_xl_base_1.0.safetensors into ComfyUI/models/checkpoints/.", run_name="treegrpo_sdxl", steps=20, cfg=4.5),
    "treegrpo_sd35_lora": real_model_workflow(
        [("ckpt", "CheckpointLoaderSimple", {"ckpt_name": "sd3.5_medium_incl_clips_t5xxlfp8scaled.safetensors"}, {})],
        ("ckpt", 0), ("ckpt", 1), ("ckpt", 2), 1024,
        "Model: put sd3.5_medium_incl_clips_t5xxlfp8scaled.safetensors into ComfyUI/models/checkpoints/.",
        run_name="treegrpo_sd35", steps=20, cfg=4.5),
    "treegrpo_sd35_ocr_lora": real_model_workflow(
        [("ckpt", "CheckpointLoaderSimple", {"ckpt_name": "sd3.5_medium_incl_clips_t5xxlfp8scaled.safetensors"}, {})],
        ("ckpt", 0), ("ckpt", 1), ("ckpt", 2), 1024,
        "Legible text: SD3.5-Medium learns to write the words its prompts quote. Model: put "
        "sd3.5_medium_incl_clips_t5xxlfp8scaled.safetensors into ComfyUI/models/checkpoints/.",
        run_name="treegrpo_sd35_ocr", steps=20, cfg=4.5, prompt_file="treegrpo/text_rendering.txt",
        reward={"reward": "ocr", "file": "(none: built-in weights or none needed)"}, reward_text=OCR_TEXT),
    "treegrpo_flux_lora": real_model_workflow(
        [("unet", "UNETLoader", {"unet_name": "flux1-dev.safetensors", "weight_dtype": "fp8_e4m3fn"}, {}),
         ("clips", "DualCLIPLoader", {"clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp16.safetensors",
                                      "type": "flux", "device": "default"}, {}),
         ("vae", "VAELoader", {"vae_name": "ae.safetensors"}, {})],
        ("unet", 0), ("clips", 0), ("vae", 0), 1024,
        "Models: flux1-dev.safetensors into ComfyUI/models/diffusion_models/, clip_l.safetensors and "
        "t5xxl_fp16.safetensors into ComfyUI/models/text_encoders/, ae.safetensors into ComfyUI/models/vae/.",
        run_name="treegrpo_flux", steps=16, cfg=1.0,
        extra_note="\nFlux is guidance-distilled: keep cfg at 1. The weights load in fp8 (UNETLoader weight_dtype) so "
                   "that training at 1024 px fits a 24 GB card; the LoRA trains in float32."),
    "treegrpo_qwen_image_lora": real_model_workflow(
        [("unet", "UNETLoader", {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}, {}),
         ("shift", "ModelSamplingAuraFlow", {"shift": 3.1}, {"model": ("unet", 0)}),
         ("clip", "CLIPLoader", {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image",
                                 "device": "default"}, {}),
         ("vae", "VAELoader", {"vae_name": "qwen_image_vae.safetensors"}, {})],
        ("shift", 0), ("clip", 0), ("vae", 0), 1024,
        "Models: qwen_image_fp8_e4m3fn.safetensors into ComfyUI/models/diffusion_models/, "
        "qwen_2.5_vl_7b_fp8_scaled.safetensors into ComfyUI/models/text_encoders/, qwen_image_vae.safetensors into "
        "ComfyUI/models/vae/.", steps=20, cfg=2.5, run_name="treegrpo_qwen_image",
        extra_note="\nQwen-Image samples with true CFG (cfg 2.5, the negative prompt) and the shift 3.1 that "
                   "ModelSamplingAuraFlow sets; the LoRA targets (auto) are its attention (image and text streams) "
                   "and MLP layers."),
    "treegrpo_zimage_lora": real_model_workflow(
        [("unet", "UNETLoader", {"unet_name": "z_image_turbo_bf16.safetensors", "weight_dtype": "default"}, {}),
         ("shift", "ModelSamplingAuraFlow", {"shift": 3.0}, {"model": ("unet", 0)}),
         ("clip", "CLIPLoader", {"clip_name": "qwen_3_4b.safetensors", "type": "lumina2", "device": "default"}, {}),
         ("vae", "VAELoader", {"vae_name": "ae.safetensors"}, {})],
        ("shift", 0), ("clip", 0), ("vae", 0), 1024,
        "Models: z_image_turbo_bf16.safetensors into ComfyUI/models/diffusion_models/, qwen_3_4b.safetensors into "
        "ComfyUI/models/text_encoders/, ae.safetensors (the Flux VAE) into ComfyUI/models/vae/.", steps=8, cfg=1.0,
        negative="", run_name="treegrpo_zimage",
        extra_note="\nZ-Image Turbo is distilled to 8 steps without CFG: keep cfg at 1 (the window is steps 1-3 of "
                   "8). The LoRA targets (auto) are its attention qkv/out and feed-forward layers."),
    "treegrpo_wan22_t2v_lora": real_model_workflow(
        [("unet", "UNETLoader", {"unet_name": "wan2.2_ti2v_5B_fp16.safetensors", "weight_dtype": "default"}, {}),
         ("shift", "ModelSamplingSD3", {"shift": 8.0}, {"model": ("unet", 0)}),
         ("clip", "CLIPLoader", {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan",
                                 "device": "default"}, {}),
         ("vae", "VAELoader", {"vae_name": "wan2.2_vae.safetensors"}, {})],
        ("shift", 0), ("clip", 0), ("vae", 0), 640,
        "Models: wan2.2_ti2v_5B_fp16.safetensors into ComfyUI/models/diffusion_models/, "
        "umt5_xxl_fp8_e4m3fn_scaled.safetensors into ComfyUI/models/text_encoders/, wan2.2_vae.safetensors into "
        "ComfyUI/models/vae/.", steps=20, cfg=5.0, height=352, run_name="treegrpo_wan22",
        negative="blurry, static, low quality, distorted, watermark, subtitles",
        prompts="a red fox running through fresh snow, slow motion\nwaves breaking on a rocky shore at sunset\n"
                "a paper boat drifting down a rainy street\na hot air balloon rising over green hills",
        frames=33, reward_frames=4, frame_stride=8,
        extra_note="\nVideo: 33 frames at 640x352 (9 latent frames). The image reward scores frames 0, 8, 16 and "
                   "24 of each leaf video and averages them; only the latent frames up to frame 24 are decoded. "
                   "Wan samples with CFG (cfg 5, the negative prompt) and shift 8 (ModelSamplingSD3)."),
    "compare_base_vs_lora": [
        ("demo", "TreeGRPOLoadDemoModel", {}, {}),
        ("lora", "LoraLoaderModelOnly", {"lora_name": "treegrpo/treegrpo_demo_00001.safetensors", "strength_model": 1.0},
         {"model": ("demo", 0)}),
        ("pos", "CLIPTextEncode", {"text": "a yellow square"}, {"clip": ("demo", 1)}),
        ("neg", "CLIPTextEncode", {"text": ""}, {"clip": ("demo", 1)}),
        ("empty", "EmptyImage", {"width": 16, "height": 16, "batch_size": 8, "color": 0}, {}),
        ("lat", "VAEEncode", {}, {"pixels": ("empty", 0), "vae": ("demo", 2)}),
        ("ks_base", "KSampler", {"seed": 7, "steps": 10, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
                                 "denoise": 1.0},
         {"model": ("demo", 0), "positive": ("pos", 0), "negative": ("neg", 0), "latent_image": ("lat", 0)}),
        ("ks_lora", "KSampler", {"seed": 7, "steps": 10, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
                                 "denoise": 1.0},
         {"model": ("lora", 0), "positive": ("pos", 0), "negative": ("neg", 0), "latent_image": ("lat", 0)}),
        ("dec_base", "VAEDecode", {}, {"samples": ("ks_base", 0), "vae": ("demo", 2)}),
        ("dec_lora", "VAEDecode", {}, {"samples": ("ks_lora", 0), "vae": ("demo", 2)}),
        ("img_base", "PreviewImage", {}, {"images": ("dec_base", 0)}),
        ("img_lora", "PreviewImage", {}, {"images": ("dec_lora", 0)}),
        note("n1", "Base model vs the same model with a TreeGRPO LoRA, same seeds. Pick the LoRA written by the "
             "demo workflow (models/loras/treegrpo/). For SD/SDXL/SD3/Flux, swap the loader for your checkpoint "
             "loader and the EmptyImage+VAEEncode for an EmptyLatentImage."),
    ],
}


def _outputs(cls):
    types = list(getattr(cls, "RETURN_TYPES", ()))
    names = list(getattr(cls, "RETURN_NAMES", None) or types)
    return [(n, t) for n, t in zip(names, types)]


# Node colours of the pack, one per node-menu category (LiteGraph's palette: LGraphCanvas.node_colors), so a
# node looks the same in every shipped workflow; built-in nodes keep ComfyUI's default look, Notes are yellow.
CATEGORY_COLORS = {
    "TreeGRPO/loaders": ("#2a363b", "#3f5159"),     # pale_blue
    "TreeGRPO/sampling": ("#223", "#335"),          # blue
    "TreeGRPO/rewards": ("#232", "#353"),           # green
    "TreeGRPO/training": ("#323", "#535"),          # purple
    "TreeGRPO/lora": ("#332922", "#593930"),        # brown
    "TreeGRPO/visualize": ("#233", "#355"),         # cyan
}
NOTE_COLOR = ("#432", "#653")                       # yellow
IMAGE_NODES = {"PreviewImage", "SaveImage", "TreeGRPOTreePreview"}
SHOWS_IMAGES_BELOW = {"TreeGRPOTrain": 300}          # widget nodes that also preview images: room below the widgets
# layout (LiteGraph units): title bar, one slot row, one widget row, a multiline text box, gaps
TITLE_H, SLOT_H, WIDGET_H, TEXTBOX_H, GAP_X, GAP_Y = 30, 20, 24, 80, 60, 50
NODE_W, NOTE_SIZE, IMAGE_SIZE = 340, (440, 240), (340, 340)


def estimate_size(cls, ctype, input_specs, widget_inputs) -> list[int]:
    """Size of a node in the web UI: its slot rows plus its widget rows (what the frontend's computeSize gives,
    within a few pixels; the frontend only ever enlarges a node that is too small).  Image previews get room."""
    if ctype in IMAGE_NODES:
        return list(IMAGE_SIZE)
    specs = {name: (typ, opts) for name, typ, opts in input_specs(cls)}
    widgets = widget_inputs(cls)
    sockets = len(specs) - len(widgets)
    rows = max(sockets, len(_outputs(cls)))
    h = rows * SLOT_H + 6
    for name, ctrl in widgets:
        typ, opts = specs[name]
        h += TEXTBOX_H if (typ == "STRING" and opts.get("multiline")) else WIDGET_H
        h += WIDGET_H if ctrl else 0
    return [NODE_W, int(h) + SHOWS_IMAGES_BELOW.get(ctype, 0)]


def layout(nodes: list[dict], depth: dict[int, int], max_cols: int = 4) -> None:
    """Columns by link depth (sources left), nodes of a column stacked in spec order; the Notes head the first
    column.  A graph more than ``max_cols`` columns deep continues in a second band below the first (so it fits
    a screen and a square thumbnail).  Positions are node bodies (the title bar sits above pos)."""
    cols: dict[int, list[dict]] = {}
    for n in nodes:
        cols.setdefault(0 if n["type"] == "Note" else depth[n["id"]], []).append(n)
    for c in cols.values():
        c.sort(key=lambda n: (n["type"] != "Note", n["order"]))
    order = sorted(cols)
    deep = [c for c in order if c > 0]
    split = deep[(len(deep) + 1) // 2] if len(deep) > max_cols else None
    x0 = x = 40
    top = bottom = 40
    for c in order:
        if c == split:
            x, top = x0, bottom + 2 * GAP_Y
        if deep and c == deep[0]:
            x0 = x                       # the second band starts under the first column of nodes
        y = top + TITLE_H
        for n in cols[c]:
            n["pos"] = [x, y]
            y += n["size"][1] + TITLE_H + GAP_Y
        bottom = max(bottom, y - GAP_Y)
        x += max(n["size"][0] for n in cols[c]) + GAP_X


def build(spec, classes, widget_inputs, input_specs) -> dict:
    ids = {key: i + 1 for i, (key, *_rest) in enumerate(spec)}
    nodes, links = [], []
    out_links: dict[tuple[int, int], list[int]] = {}
    col = {}
    depth = {}
    for order, (key, ctype, widgets, inputs) in enumerate(spec):
        nid = ids[key]
        if ctype == "Note":
            nodes.append({"id": nid, "type": "Note", "pos": [0, 0], "size": list(NOTE_SIZE), "flags": {},
                          "order": order, "mode": 0, "inputs": [], "outputs": [], "properties": {},
                          "widgets_values": [widgets["text"]], "color": NOTE_COLOR[0], "bgcolor": NOTE_COLOR[1]})
            continue
        cls = classes[ctype]
        col[key] = depth[nid] = 1 + max([col.get(src, 0) for src, _ in inputs.values()] or [0])
        node_inputs = []
        for name, typ, opts in input_specs(cls):
            is_widget = isinstance(typ, (list, tuple)) or typ in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
            if name in inputs:
                src, slot = inputs[name]
                lid = len(links) + 1
                src_type = _outputs(classes[spec[ids[src] - 1][1]])[slot][1]
                links.append([lid, ids[src], slot, nid, len(node_inputs), src_type])
                out_links.setdefault((ids[src], slot), []).append(lid)
                entry = {"name": name, "type": typ if not is_widget else src_type, "link": lid}
                if is_widget:
                    entry["widget"] = {"name": name}
                node_inputs.append(entry)
            elif not is_widget:
                if opts is not None and name in (cls.INPUT_TYPES().get("optional") or {}):
                    continue
                raise ValueError(f"{key}: required input {name!r} of {ctype} is not connected")
        values = []
        for name, ctrl in widget_inputs(cls):
            if name not in widgets:
                default = dict((n, o) for n, _t, o in input_specs(cls))[name].get("default")
                if default is None:
                    opts = [t for n, t, _o in input_specs(cls) if n == name][0]
                    default = opts[0] if isinstance(opts, (list, tuple)) and opts else None
                values.append(default)
            else:
                values.append(widgets[name])
            if ctrl:
                values.append("fixed")
        unknown = set(widgets) - {n for n, _ in widget_inputs(cls)}
        if unknown:
            raise ValueError(f"{key}: {ctype} has no widget(s) {sorted(unknown)}")
        node = {"id": nid, "type": ctype, "pos": [0, 0], "size": estimate_size(cls, ctype, input_specs, widget_inputs),
                "flags": {}, "order": order, "mode": 0, "inputs": node_inputs,
                "outputs": [], "properties": {"Node name for S&R": ctype}, "widgets_values": values,
                "_outs": _outputs(cls)}
        colors = CATEGORY_COLORS.get(getattr(cls, "CATEGORY", ""))
        if colors:
            node["color"], node["bgcolor"] = colors
        elif ctype.startswith("TreeGRPO"):
            raise ValueError(f"{ctype}: category {getattr(cls, 'CATEGORY', None)!r} has no colour in CATEGORY_COLORS")
        nodes.append(node)
    for n in nodes:
        outs = n.pop("_outs", [])
        n["outputs"] = [{"name": name, "type": typ, "links": out_links.get((n["id"], i), []), "slot_index": i}
                        for i, (name, typ) in enumerate(outs)]
    layout(nodes, depth)
    return {"last_node_id": len(spec), "last_link_id": len(links), "nodes": nodes, "links": links, "groups": [],
            "config": {}, "extra": {"ds": {"scale": 0.8, "offset": [0, 0]}}, "version": 0.4}


def main() -> None:
    import comfy_harness as ch

    rt = ch.boot_comfy(ch.REPO_ROOT, tempfile.mkdtemp(), require_pack=True)
    classes = rt.node_classes()
    for name, spec in WORKFLOWS.items():
        wf = build(spec, classes, ch.widget_inputs, ch._input_specs)
        ch.workflow_to_api(wf, classes)  # must convert
        with open(os.path.join(HERE, f"{name}.json"), "w", encoding="utf-8") as fh:
            json.dump(wf, fh, indent=1)
            fh.write("\n")
        print("wrote", name)


if __name__ == "__main__":
    main()
