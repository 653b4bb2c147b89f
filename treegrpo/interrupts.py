"""Ctrl-C and SIGTERM for the command line: at any moment, start-up included, a run ends with one line, its last
finished iteration checkpointed, and exit code 130 — never a traceback.

The handlers set a flag and raise KeyboardInterrupt. Library code can swallow that (a bare ``except:`` around an
import, a finaliser run by the garbage collector): the trainer's stop check (:func:`interrupt_requested`) and the
command line's return read the flag, so a swallowed Ctrl-C still ends the run at the next step. SIGTERM (docker stop,
SLURM, systemd) is answered as Ctrl-C.

    with interrupts.handled() as interrupted:      # installs the handlers on the main thread, puts them back after
        ...
        if interrupted.is_set():
            return interrupts.report()
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

from .callbacks import TrainerCallback       # imports nothing: safe while an import may be what was interrupted

_INTERRUPT = threading.Event()
_HANDLERS: dict = {}        # signal number -> our handler, while :func:`handled` has them installed
_SAVED: list = []           # the checkpoints the run of :func:`handled` wrote (:class:`CheckpointNote`)


class CheckpointNote(TrainerCallback):
    """The command line's trainer callback: notes each checkpoint written, for :func:`report`'s line."""

    def on_checkpoint(self, trainer, path) -> None:
        if path:
            _SAVED.append(path)


def _on_sigint(signum, frame):
    _INTERRUPT.set()
    raise KeyboardInterrupt


def _terminate(signum, frame):
    """SIGTERM is answered as Ctrl-C: the trainer checkpoints, then the command line exits."""
    _INTERRUPT.set()
    raise KeyboardInterrupt(f"signal {signum}")


def _quiet_unraisable(previous):
    """An ``sys.unraisablehook`` that says nothing of the KeyboardInterrupt our handler raised inside a finaliser
    (``__del__`` during garbage collection: Python would print "Exception ignored ... Traceback"): the flag stops the
    run anyway. Anything else goes to ``previous``."""
    def hook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _INTERRUPT.is_set():
            return
        previous(unraisable)
    return hook


def interrupt_requested() -> bool:
    """The trainer's ``stop`` check of the command line: True once Ctrl-C or SIGTERM came, even where a library
    swallowed the KeyboardInterrupt. A handler that a library replaced ours with is put back (on the main thread)."""
    if _HANDLERS and _main_thread():
        for signum, handler in _HANDLERS.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
    return _INTERRUPT.is_set()


@contextlib.contextmanager
def handled() -> Iterator[threading.Event]:
    """Our SIGINT / SIGTERM handlers (main thread only) and the quiet unraisable hook for the block; yields the flag.
    Afterwards the flag and the checkpoints noted are cleared and the handlers and hook found before are put back."""
    _INTERRUPT.clear()
    _SAVED.clear()
    previous = {}
    unraisable = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable(unraisable)
    if _main_thread():
        for signum, handler in ((signal.SIGTERM, _terminate), (signal.SIGINT, _on_sigint)):
            previous[signum] = signal.signal(signum, handler)
            _HANDLERS[signum] = handler
    try:
        yield _INTERRUPT
    finally:
        sys.unraisablehook = unraisable
        _HANDLERS.clear()
        _INTERRUPT.clear()
        _SAVED.clear()
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)


def report(exit_now: bool = False) -> int:
    """One line about the interrupt; 130. ``exit_now`` (the real command line): leave at once, as the shell expects
    of Ctrl-C. Finalising the interpreter after an import was cut short (torch half-imported) sometimes ended the
    process by SIGINT after this line; the checkpoint and the run lock are already dealt with by then."""
    saved = _SAVED[-1] if _SAVED else None
    if os.environ.get("RANK", "0") not in ("", "0"):   # torchrun: the first process says it (only it saves)
        if exit_now:
            os._exit(130)
        return 130
    import re
    done = re.search(r"-(\d+)\.pt$", saved or "")
    lora = (f"; --resume --iterations {int(done.group(1))} writes that iteration's LoRA without training"
            if done and int(done.group(1)) else "")
    print("treegrpo: interrupted" + (f"; the last finished iteration is saved in {saved} (resume with --resume{lora})"
                                     if saved else " before any iteration finished: nothing to resume"),
          file=sys.stderr)
    if exit_now:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return 130


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
