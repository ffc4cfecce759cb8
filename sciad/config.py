"""Global switches.

- `enable_checks` (default False): verify every graph after each pass and
  transform, and check structure tags where they are introduced. The test
  suite turns it on; it costs trace time, never run time.

Float64: sciad follows NumPy's dtypes exactly. Every sciad computation (an
`sd.function` call, an eager `sciad.numpy` op, lowering) runs inside JAX's
scoped `jax.enable_x64(True)` context, so float64 inputs stay float64 and
your other JAX code keeps the configuration you gave it. If JAX's x64 mode is
already on globally (`JAX_ENABLE_X64=1` or
`jax.config.update("jax_enable_x64", True)`), sciad skips the scope, which
saves about a microsecond per call.
"""

from __future__ import annotations

import contextlib

import jax

enable_checks: bool = False


@contextlib.contextmanager
def checks(enabled: bool = True):
    """Temporarily sets `enable_checks`."""
    global enable_checks
    old, enable_checks = enable_checks, enabled
    try:
        yield
    finally:
        enable_checks = old


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit dtypes here (globally or in a scope)."""
    return bool(jax.enable_x64.value)


def x64_scope():
    """A context in which JAX keeps 64-bit dtypes (a no-op if already on)."""
    if jax.enable_x64.value:
        return contextlib.nullcontext()
    return jax.enable_x64(True)
