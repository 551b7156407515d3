"""The CPU's BLAS threads: how many threads numpy's matrix products (the CPU backend's) may use.

dlrun chooses the count itself rather than leaving it to the BLAS library, which starts one
thread per core: on a machine whose cores are busy with other work, those threads wait for
each other at every product (a small CNN ran twice as slow with two threads as with one beside
two busy processes on a 2-core machine, and up to 20 times as slow under heavier load, where
two threads gained 20 % when the machine was idle; docs/performance.md has the figures). The count comes from
``--threads``, else the ``DLRUN_THREADS`` environment variable, else a variable that the BLAS
library reads itself (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``), which
is then left in charge, else :data:`DEFAULT`.
"""
from __future__ import annotations

import os

from threadpoolctl import ThreadpoolController

DEFAULT = 1  # measured: see docs/performance.md ("BLAS threads")
ENV = "DLRUN_THREADS"
BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")

_controller: ThreadpoolController | None = None
_limited = None  # the limiter in force (its restore_original_limits undoes it)


def _pools() -> ThreadpoolController:
    global _controller
    if _controller is None:  # (inspects the loaded libraries once: a few milliseconds)
        _controller = ThreadpoolController()
    return _controller


def chosen(threads: int | None) -> int | None:
    """The count to set: ``threads`` (``--threads`` or DLRUN_THREADS, as given), else None when
    the environment sets the BLAS library's own variable (left to it), else :data:`DEFAULT`."""
    if threads is not None:
        return threads
    if any(os.environ.get(name, "").strip() for name in BLAS_ENV):
        return None
    return DEFAULT


def limit(threads: int | None) -> int:
    """Set the BLAS pools to :func:`chosen` ``(threads)`` threads and return the count now in force."""
    global _limited
    n = chosen(threads)
    restore()
    if n is not None:
        _limited = _pools().limit(limits=n, user_api="blas")
    return current()


def current() -> int:
    """The threads the BLAS pools use now (the largest pool's; 1 without a BLAS pool)."""
    return max((p.num_threads for p in _pools().select(user_api="blas").lib_controllers), default=1)


def restore() -> None:
    """Put back the counts from before :func:`limit` (the CLI's commands leave the process as
    they found it; the test suite runs them in one process)."""
    global _limited
    if _limited is not None:
        _limited.restore_original_limits()
        _limited = None
