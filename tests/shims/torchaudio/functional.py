"""Test-only stand-in for a ``torchaudio`` submodule: imports, and raises on use (see the package's docstring)."""
from . import __getattr__  # noqa: F401  (the package's: anything used from here raises)
