"""OCR readers on drawn text: the ``ocr`` reward's reader against the one it replaced, on the same pictures.

Readers: ``v6`` — the reward as shipped (PP-OCRv6 small detection and recognition, rapidocr 3.10);
``v4`` — PP-OCRv4 mobile in rapidocr-onnxruntime 1.4.4 (the reward's reader until 2026-12-06; measured only where
that package is installed: ``pip install --no-deps rapidocr-onnxruntime==1.4.4``). Both read the same pictures and
are scored by the same rule (``treegrpo.rewards.ocr.text_reward``: 1 − normalised edit distance).

Pictures: 11 texts (the 3 the tests use and 8 they do not) × 4 faces (three DejaVu fonts and Pillow's own) × 4
(text height in pixels, picture side) = 176. Text whose drawn width exceeds the picture is cut off and cannot be read
whole; the tables count it apart ("fits": its ink box lies inside the picture). Time: seconds per picture, one
ONNX Runtime thread, the median over the pictures of each size after one warm-up call.

    python benchmarks/bench_ocr.py [--readers v6 v4] [--threads 1] [--out benchmarks/results/ocr_readers.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import reward_fixtures as rf  # noqa: E402
from treegrpo.io import atomic_write_json  # noqa: E402
from treegrpo.rewards.ocr import bgr_array, text_reward  # noqa: E402

TEXTS = ["OPEN", "COFFEE", "SUMMIT 2 KM",                                   # tests/unit/test_ocr.py
         "BAKERY", "HELLO WORLD", "NO PARKING", "EXIT 12", "Fresh Bread", "MOUNTAIN VIEW", "GOOD LUCK", "STOP"]
SIZES = [(32, 256), (56, 384), (24, 512), (64, 512)]                        # (text height px, picture side px)


class V4Reader:
    """PP-OCRv4 mobile (rapidocr-onnxruntime 1.4.4): the reward's reader before, for comparison only."""

    def __init__(self, threads: int):
        from rapidocr_onnxruntime import RapidOCR

        self.engine = RapidOCR(print_verbose=False, intra_op_num_threads=threads, inter_op_num_threads=1)

    def read(self, image) -> str:
        result, _ = self.engine(bgr_array(image))
        return " ".join(text for _, text, score in (result or []) if float(score) >= 0.5)


def reader(name: str, threads: int):
    if name == "v6":
        from treegrpo.rewards.base import load_reward

        return load_reward("ocr", threads=threads)
    return V4Reader(threads)


def fixtures(texts=TEXTS, sizes=SIZES):
    """[(text, face, px, side, fits)]: every text in every face at every size."""
    return [(t, face, px, side, rf.text_width(t, face, px) <= side)
            for t in texts for face in rf.FACES for px, side in sizes]


def measure(name: str, threads: int, cases) -> dict:
    r = reader(name, threads)
    r.read(rf.drawn_text("WARM", None, 32, 256))
    rows, seconds = [], {}
    for text, face, px, side, fits in cases:
        img = rf.drawn_text(text, face, px, side)
        t0 = time.perf_counter()
        read = r.read(img)
        seconds.setdefault(side, []).append(time.perf_counter() - t0)
        rows.append({"text": text, "face": face or "Pillow", "px": px, "side": side, "fits": fits, "read": read,
                     "reward": text_reward(read, text)})
    fit = [x["reward"] for x in rows if x["fits"]]
    cut = [x["reward"] for x in rows if not x["fits"]]
    summary = {"pictures": len(rows), "mean": statistics.fmean(x["reward"] for x in rows),
               "exact": sum(x["reward"] == 1.0 for x in rows), "fits": len(fit),
               "fits_mean": statistics.fmean(fit) if fit else None, "fits_exact": sum(v == 1.0 for v in fit),
               "fits_below_0.9": sum(v < 0.9 for v in fit), "fits_min": min(fit) if fit else None,
               "cut_mean": statistics.fmean(cut) if cut else None,
               "seconds_per_picture": {str(k): statistics.median(v) for k, v in sorted(seconds.items())}}
    return {"summary": summary, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readers", nargs="+", default=["v6", "v4"], choices=["v6", "v4"])
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per reader")
    ap.add_argument("--texts", nargs="+", default=TEXTS)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "ocr_readers.json"))
    a = ap.parse_args(argv)
    cases = fixtures(a.texts)
    out = {"threads": a.threads, "texts": a.texts, "sizes": SIZES, "readers": {}}
    print(f"{'reader':6s} {'pictures':>8s} {'exact':>7s} {'fits: exact':>12s} {'fits < 0.9':>10s} {'fits min':>8s} "
          f"{'mean':>6s}  s/picture by side")
    for name in a.readers:
        if name == "v4":
            try:
                import rapidocr_onnxruntime  # noqa: F401
            except ImportError:
                print("v4: rapidocr-onnxruntime is not installed; skipped")
                continue
        res = measure(name, a.threads, cases)
        out["readers"][name] = res
        s = res["summary"]
        print(f"{name:6s} {s['pictures']:8d} {s['exact']:7d} {s['fits_exact']:>5d} / {s['fits']:<4d} "
              f"{s['fits_below_0.9']:10d} {s['fits_min'] if s['fits_min'] is not None else float('nan'):8.3f} "
              f"{s['mean']:6.3f}  " + " ".join(f"{k}: {v:.2f}" for k, v in s["seconds_per_picture"].items()),
              flush=True)
        for x in res["rows"]:
            if x["reward"] < 1.0 and x["fits"]:
                print(f"    misread (fits): {x['text']!r} {x['face']} {x['px']} px on {x['side']}: {x['read']!r} "
                      f"{x['reward']:.3f}")
    atomic_write_json(a.out, out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
