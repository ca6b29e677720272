"""Signals that no library can turn into a crash: the thread's alternate signal stack (issue 36).

Linux runs a handler installed with SA_ONSTACK on the thread's alternate signal stack, when the thread has one.
Every handler Python installs has that flag: ``signal.signal``, asyncio's ``add_signal_handler``, the default
SIGINT handler. OpenVINO's CPU plugin (``SigAltStackSetup``, openvino/src/plugins/intel_cpu/src/sigstack_manager.cpp)
gives the thread that creates it a new alternate stack of its own (mmap) and unmaps it when the plugin is destroyed;
it gives the previous stack back only when it is destroyed on that same thread while its stack is still current.
Destroyed on another thread, or after a second plugin (two ``ov.Core`` freed first in, first out), it leaves the
thread an alternate stack that is no longer mapped: the kernel cannot write the next signal's frame and kills the
process with SIGSEGV (``si_code`` SI_KERNEL), wherever the thread was. No Python traceback: faulthandler needs
that stack too. It killed pytest's test processes at the job watch's first interrupt after an OpenVINO test, and
would kill a worker, or a server at its SIGTERM, the same way (tests/workers/test_signal_stack.py shows it).

Two defences, both here:

- ``keep_alternate_stack()``: called after code that may create OpenVINO's CPU plugin, it gives the calling thread
  back an alternate stack owned by this module (one per thread, never freed), so that the plugin's stack is never
  the current one when the plugin unmaps it.
- ``install(signum, handler)``: ``signal.signal``, then SA_ONSTACK cleared, so that farm's own signals (the job
  watch's interrupt, a worker's or server's SIGTERM) are delivered on the thread's own stack whatever a library
  did to the alternate one. Python's handler only sets a flag there; the thread's stack has room for it.

Hand-written with ctypes: neither the standard library nor a maintained package exposes sigaction's flags or
sigaltstack. Linux on x86_64 and aarch64 (glibc's ``struct sigaction`` layout); elsewhere both are no-ops.
"""
from __future__ import annotations

import ctypes
import platform
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

SA_ONSTACK = 0x08000000
AT_MINSIGSTKSZ = 51  # getauxval key: the smallest signal frame on this CPU, bytes (Linux >= 5.14)
#: room for signal frames on farm's alternate stack, on top of the CPU's minimum, bytes
STACK_BYTES = 64 * 1024
SUPPORTED = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


class _Sigaction(ctypes.Structure):
    """glibc's ``struct sigaction`` (x86_64, aarch64)."""

    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


class _Stack(ctypes.Structure):
    """``stack_t``."""

    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True) if SUPPORTED else None
_stacks: dict[int, ctypes.Array[ctypes.c_char]] = {}  # thread ident -> its stack, kept for the process's life
_lock = threading.Lock()


def onstack(signum: int) -> bool | None:
    """Whether ``signum``'s handler runs on the alternate stack (None where this cannot be read)."""
    if _libc is None:
        return None
    action = _Sigaction()
    if _libc.sigaction(int(signum), None, ctypes.byref(action)) != 0:
        return None
    return bool(action.flags & SA_ONSTACK)


def deliver_on_thread_stack(signum: int) -> bool:
    """Clear SA_ONSTACK from ``signum``'s current handler; False where it could not be (or nothing to do)."""
    if _libc is None:
        return False
    action = _Sigaction()
    if _libc.sigaction(int(signum), None, ctypes.byref(action)) != 0:
        return False
    if not action.flags & SA_ONSTACK:
        return True
    action.flags &= ~SA_ONSTACK
    return _libc.sigaction(int(signum), ctypes.byref(action), None) == 0


def install(signum: int, handler: Handler) -> Handler:
    """``signal.signal(signum, handler)``, delivered on the thread's own stack; returns the previous handler."""
    previous = signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    deliver_on_thread_stack(signum)
    return previous


def restore(signum: int, previous: Handler) -> None:
    """Put back what ``install`` returned (SIG_DFL where it was not set from Python)."""
    install(signum, previous if previous is not None else signal.SIG_DFL)


def current_alternate_stack() -> tuple[int, int] | None:
    """The calling thread's alternate stack as (address, size); None where it has none or this cannot be read."""
    if _libc is None:
        return None
    old = _Stack()
    if _libc.sigaltstack(None, ctypes.byref(old)) != 0 or old.flags & 2:  # SS_DISABLE
        return None
    return int(old.sp or 0), int(old.size)


def keep_alternate_stack() -> bool:
    """Give the calling thread farm's own alternate signal stack (allocated once per thread, never freed), in
    place of whatever a library left there; False where it could not be set."""
    if _libc is None:
        return False
    ident = threading.get_ident()
    with _lock:
        buf = _stacks.get(ident)
        if buf is None:
            _libc.getauxval.restype = ctypes.c_ulong
            buf = ctypes.create_string_buffer(int(_libc.getauxval(AT_MINSIGSTKSZ)) + STACK_BYTES)
            _stacks[ident] = buf
    address = ctypes.addressof(buf)
    if current_alternate_stack() == (address, len(buf)):
        return True
    new = _Stack(ctypes.c_void_p(address), 0, len(buf))
    return _libc.sigaltstack(ctypes.byref(new), None) == 0
