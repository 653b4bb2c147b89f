"""Test-only stand-in for ``torchaudio``: no torchaudio build exists for the torch the tests run on, and ComfyUI
0.33+ imports it at start-up (comfy/sd.py → the LTX-2 audio VAE, Gemma's text encoder). The pack trains no audio
model; anything used from here raises. On the path only for the newest-ComfyUI lane when torchaudio is absent
(tests/comfy_harness.py ``shim_paths``)."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(f"torchaudio.{name} is not available: torchaudio is not installed (the test suite's stand-in)")
