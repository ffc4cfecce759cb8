"""Host work that does not oversubscribe the cores.

sciad runs its host-side factorizations on threads of its own, one per core
(`_sparse_direct`), and XLA runs the host calls on its own worker threads.
Each of those calls into SciPy's and NumPy's OpenBLAS, which starts a
thread per core of its own: k factorizations at once asked for k x cores
threads. `one_blas_thread()` caps every BLAS library loaded in the process
(NumPy's and SciPy's OpenBLAS, MKL, ...) at one thread while host work runs,
and restores the caller's setting when the last such work ends.

The cap is process-wide (OpenBLAS keeps one thread count), so it is
reference-counted: overlapping host calls (a batch's factorizations, the
solves of several devices) share one cap, and the first to start sets it.
Measured on the 2-core machine under load (a full test run beside it), four
SuperLU factorizations of a 20^3 7-point Laplacian over sciad's two
threads: 10.1 s with BLAS's default of 2 threads, 8.6 s capped at 1; one
factorization alone: 3.6 s and 3.5 s (SuperLU's BLAS calls are small
level-2 ones that gain nothing from BLAS's threads). Entering and leaving
costs about 3 us.
"""

from __future__ import annotations

import contextlib
import os
import threading

try:
    import threadpoolctl
except ImportError:  # pragma: no cover - a declared dependency
    threadpoolctl = None

_lock = threading.Lock()
_depth = 0
_limiter = None
_controller = None


def _get_controller():
    global _controller
    if _controller is None and threadpoolctl is not None:
        _controller = threadpoolctl.ThreadpoolController()
    return _controller


@contextlib.contextmanager
def one_blas_thread():
    """Caps the process's BLAS libraries at one thread while the block runs
    (re-entrant and thread-safe; the setting before the first entry comes
    back after the last exit).

    Example::

        with one_blas_thread():
            lu = scipy.sparse.linalg.splu(a)
    """
    global _depth, _limiter
    with _lock:
        _depth += 1
        if _depth == 1:
            controller = _get_controller()
            _limiter = None if controller is None else controller.limit(limits=1,
                                                                        user_api="blas")
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as `taskset` sets it).

    Example::

        workers = min(usable_cores(), 8)
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def active() -> bool:
    """Whether host work holds the cap now (for tests)."""
    return _depth > 0
