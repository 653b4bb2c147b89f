"""``ocr``: does the image show the text the prompt asks for? Flow-GRPO's OCR task, on a real OCR model.

The prompt names the text in quotes (straight ``"…"`` or curly ``“…”`` double quotes, as Flow-GRPO's OCR prompts do;
also ``„…“``, ``«…»``, ``「…」`` and ``『…』``):
``a storefront sign that says "OPEN"``; several quoted spans are one text, joined by a space. RapidOCR (PP-OCRv6
text detection and recognition in ONNX Runtime: on the run's GPU where onnxruntime-gpu is installed and the run is
given one, as ``treegrpo train`` does; ComfyUI's Reward Model Loader builds it on the CPU, outside the VRAM ComfyUI
manages; the models ship inside its wheel, nothing is downloaded) reads the image; the text found is its boxes' texts in
the order it returns them (top to bottom, left to right), boxes below ``min_score`` confidence left out.

Both texts are compared after :func:`normalise`: lower case, every whitespace character removed (an OCR model
splits or joins words at will: "Hello World" is often read "HelloWorld"). With t the wanted text and r the text
read, ``reward = 1 − min(d(r, t), |t|) / |t|`` where d is the Levenshtein distance (insertions, deletions and
substitutions of one character each cost 1): 1 for the exact text, 0 when nothing was read or nothing matches. This
is Flow-GRPO's ``ocr.py`` rule (it uses PaddleOCR; the models here are PaddleOCR's PP-OCRv6 small detection and
recognition models in ONNX, as rapidocr 3.10 ships them, with its PP-OCR mobile text-direction classifier).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Optional

import torch

from .base import check_batch, register

#: the quotes a prompt may put the text in: straight and curly double quotes, German „…“, guillemets «…» and
#: Japanese / Chinese corner brackets 「…」 『…』; a straight quote right after a letter or digit opens nothing (the
#: inch mark of 12")
QUOTES = '"…", “…”, „…“, «…», 「…」 or 『…』'
_QUOTED = re.compile(r'(?<!\w)"([^"]+)"|“([^”]+)”|„([^“”]+)[“”]|«\s*([^»]+?)\s*»|「([^」]+)」|『([^』]+)』')


def quoted_text(prompt: str) -> str:
    """The text a prompt asks to be written: its quoted spans (:data:`QUOTES`) joined by a space ('' when it has
    none)."""
    spans = ("".join(groups).strip() for groups in _QUOTED.findall(prompt))
    return " ".join(t for t in spans if t)


def normalise(text: str) -> str:
    """Lower case, whitespace removed."""
    return "".join(text.lower().split())


def levenshtein(a: str, b: str) -> int:
    """The edit distance between ``a`` and ``b`` (insert, delete, substitute: 1 each); O(|a|·|b|)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def text_reward(read: str, wanted: str) -> float:
    """``1 − min(d, |t|) / |t|`` on the normalised texts (t: ``wanted``, not empty after normalising)."""
    r, t = normalise(read), normalise(wanted)
    if not t:
        raise ValueError(f"the text to write, {wanted!r}, is empty once whitespace is removed")
    return 1.0 - min(levenshtein(r, t), len(t)) / len(t)


#: the recogniser's model file in the rapidocr package (its character list is in the file's metadata)
REC_MODEL = "PP-OCRv6_rec_small.onnx"


@functools.lru_cache(maxsize=1)
def recogniser_characters() -> Optional[frozenset]:
    """The characters PP-OCRv6's recogniser can output (about 18,700: Latin with its accents, Chinese, Japanese
    kana, Greek without tonos, digits, punctuation; no Cyrillic, no Hangul), read from its model file's metadata; None
    where rapidocr or onnxruntime is not installed (the reward's loader then says how to install them)."""
    try:
        import onnxruntime
        spec = importlib.util.find_spec("rapidocr")      # its folder, without importing it (OpenCV and the rest)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", REC_MODEL)
    try:
        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        chars = sess.get_modelmeta().custom_metadata_map.get("character", "")
    except Exception:  # noqa: BLE001 - a missing or damaged file: the reward's loader names it
        return None
    return frozenset(chars.splitlines()) or None


def check_prompts(prompts: list[str], who: str = "ocr") -> None:
    """Refuse, naming them, prompts that quote no text (the reward would have nothing to compare with), and prompts
    whose text the recogniser cannot write out (characters it does not know: the reward could never reach 1, and
    text wholly in such a script, e.g. Cyrillic, would score 0 however well it is drawn)."""
    bad = [p for p in prompts if not normalise(quoted_text(p))]
    if bad:
        shown = "; ".join(repr(p[:80]) for p in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"reward {who!r} compares the text the prompt quotes with the text read in the image, and "
                         f"{len(bad)} prompt(s) quote none: {shown}. Put the text in quotes ({QUOTES}), e.g. "
                         f'a storefront sign that says "OPEN" (the shipped set text_rendering.txt has such prompts)')
    known = recogniser_characters()
    if known is None:
        return
    unknown = {p: sorted({c for c in quoted_text(p) if not c.isspace() and c not in known}) for p in prompts}
    unknown = {p: cs for p, cs in unknown.items() if cs}
    if unknown:
        chars = sorted(set().union(*unknown.values()))
        shown = "; ".join(repr(p[:80]) for p in list(unknown)[:3]) + (f" and {len(unknown) - 3} more"
                                                                      if len(unknown) > 3 else "")
        raise ValueError(f"reward {who!r} reads with PP-OCRv6, whose recogniser knows no {''.join(chars[:12])!r}"
                         f"{' ...' if len(chars) > 12 else ''}: {len(unknown)} prompt(s) quote text it can never read "
                         f"back ({shown}), so their reward could not reach 1 (0 for a script it does not read, such "
                         "as Cyrillic or Hangul). Quote text in Latin letters (accents included), Chinese, Japanese "
                         "kana or Greek without accents")


def bgr_array(image: torch.Tensor):
    """An image (3, H, W) in [0, 1] as the (H, W, 3) uint8 array in OpenCV's BGR order that RapidOCR reads."""
    import numpy as np

    arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return np.ascontiguousarray(arr[:, :, ::-1])


def engine_device_params(device) -> dict:
    """RapidOCR's settings for the run's ``device``: on a CUDA device, ONNX Runtime's CUDA provider on that card
    (used where onnxruntime-gpu is installed; RapidOCR reads on the CPU otherwise), its convolution algorithm
    chosen by heuristic, not timed for every shape (the recogniser's input width changes with each text line);
    nothing on any other device."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return {}
    return {"EngineConfig.onnxruntime.use_cuda": True,
            "EngineConfig.onnxruntime.cuda_ep_cfg.device_id": dev.index or 0,
            "EngineConfig.onnxruntime.cuda_ep_cfg.cudnn_conv_algo_search": "HEURISTIC"}


@register("ocr")
class OCRReward:
    """Reward = how much of the prompt's quoted text a real OCR model reads in the image (see the module).
    Options: ``min_score`` (the confidence below which a box's text is left out) and ``threads`` (ONNX Runtime's CPU
    threads; 0: every core)."""

    name = "ocr"
    requires_module = "rapidocr"     # an optional extra (treegrpo.deps.OPTIONAL)
    check_prompts = staticmethod(check_prompts)
    source = "RapidOCR (github RapidAI/RapidOCR): PaddleOCR's PP-OCRv6 models inside the rapidocr 3.10 wheel"
    licence = "Apache-2.0"
    #: the model files, inside the rapidocr package, given to it by path so that it never downloads one
    MODEL_FILES = {"Det": "PP-OCRv6_det_small.onnx", "Rec": REC_MODEL,
                   "Cls": "ch_ppocr_mobile_v2.0_cls_mobile.onnx"}

    def __init__(self, path=None, device="cpu", min_score: float = 0.5, threads: int = 0):
        if path:
            raise ValueError(f"{self.name} needs no weight file (its models come with rapidocr), got path={path!r}")
        if not 0.0 <= float(min_score) <= 1.0:
            raise ValueError(f"{self.name}: min_score must be a confidence in [0, 1], got {min_score!r}")
        if int(threads) != threads or threads < 0:
            raise ValueError(f"{self.name}: threads must be a whole number ≥ 0 (0: every core), got {threads!r}")
        from ..deps import optional_install_command, require_optional
        require_optional("rapidocr")      # and what it imports: onnxruntime, OpenCV (cv2), ... (treegrpo.deps)
        import rapidocr
        from rapidocr import RapidOCR

        folder = os.path.join(os.path.dirname(rapidocr.__file__), "models")
        files = {part: os.path.join(folder, f) for part, f in self.MODEL_FILES.items()}
        missing = [f for f in files.values() if not os.path.isfile(f)]
        if missing:
            raise ImportError(f"the ocr reward needs rapidocr 3.10, whose wheel carries its models, but {folder} "
                              f"lacks {', '.join(map(os.path.basename, missing))} (another rapidocr version is "
                              f"installed); install it with {optional_install_command('rapidocr')}")
        params = {f"{part}.model_path": f for part, f in files.items()}
        params.update({"Global.log_level": "error", "Global.text_score": float(min_score),
                       "EngineConfig.onnxruntime.intra_op_num_threads": int(threads) or -1})
        params.update(engine_device_params(device))
        self.engine = RapidOCR(params=params)
        self.min_score = float(min_score)

    def read(self, image: torch.Tensor) -> str:
        """The text read in one image (3, H, W) in [0, 1]: the boxes' texts with confidence ≥ ``min_score``."""
        out = self.engine(bgr_array(image))
        texts, scores = out.txts or (), out.scores or ()
        return " ".join(text for text, score in zip(texts, scores) if float(score) >= self.min_score)

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """(B,) rewards in [0, 1] of images (B, 3, H, W) in [0, 1] for their prompts."""
        check_batch(images, prompts, self.name)
        check_prompts(prompts, self.name)
        return torch.tensor([text_reward(self.read(img), quoted_text(p)) for img, p in zip(images, prompts)],
                            dtype=torch.float32)
