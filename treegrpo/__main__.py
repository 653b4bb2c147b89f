"""``python -m treegrpo``: the ``treegrpo`` command (:func:`treegrpo.cli.main`), for a Python whose scripts folder is
not on the PATH (ComfyUI's embedded Python on Windows)."""
import sys

from .cli import main

sys.exit(main())
