"""Global switches.

- `enable_checks` (default False): the expensive checks. Verify every graph
  after each pass and transform (trace time), and estimate the condition
  number of every sparse direct solve (a few extra triangular solves per
  factorization, run time), so an ill-conditioned sparse system warns even
  when its residual is small. The cheap checks (finiteness, symmetry tags,
  the backward error of direct solves, solver status) are always on. It is
  part of the compile cache key: an `sd.function` or `sd.to_jax` function
  traced with checks off is traced again when they are on, and the other
  way round. The test suite turns it on.

- `analysis_cache_budget` (default 1 GiB, or `$SCIAD_ANALYSIS_CACHE_BYTES`):
  the bytes that what sciad derives from sparsity patterns (symbolic
  analyses, AMG hierarchies, index maps, fill estimates) may hold; an int
  or a string such as "512MiB". `analysis_cache_info()` reports the cache
  (entries, bytes, hits per kind), `clear_analysis_cache()` empties it.

Float64 (see docs/getting-started.md, "Float64"): importing sciad turns on JAX's x64 mode
(`jax_enable_x64`), so that float64 values stay float64 inside sciad and in
whatever your code does with its results (`a * 2.0` on an `sd.function`
result stays float64, as with NumPy). Your explicit choice wins: if the
environment sets `JAX_ENABLE_X64` (to anything), or `SCIAD_ENABLE_X64=0`,
sciad leaves the switch as it is. With x64 off, sciad still computes in
float64 (inside JAX's scoped `jax.enable_x64(True)` around each call), but
its float64 results become float32 as soon as JAX code outside sciad
touches them.

Large constants (see docs/getting-started.md, "Large constants"): a
program that holds a large array (a mesh's index maps, the scatter index of
a sparse pattern) should pass it to the executable as a buffer made once,
not copy it into the program's text, the compiler and the executable. JAX
does so with `jax_use_simplified_jaxpr_constants` (its coming default),
which it reads when it is first imported: importing sciad before JAX turns
it on, for arrays over 1 KiB (smaller ones stay in the text, where the
compiler may fold them: `jax_embedded_constants_max_bytes`, 32 bytes by
JAX's default). If JAX was imported first, set `JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1`
in the environment. Your choice wins: with that variable set (to
anything), or `SCIAD_HOIST_CONSTANTS=0`, sciad leaves the switches alone.
`constants_policy` says what decided.

Small loops (see docs/getting-started.md, "Small loops"): XLA's CPU
compiler runs most programs as a sequence of compiled kernels, one runtime
dispatch each; a `while` loop whose body touches fewer than 1 KiB a pass,
and calls no library, it compiles as one function instead. Importing sciad
raises that threshold to 64 KiB (`XLA_FLAGS`, read when JAX's backend
starts), so that an implicit integrator's step on a few states runs as one
function: Robertson's BDF solve went from 1.4 to 0.27 ms. Your choice wins:
with `xla_backend_extra_options` in `XLA_FLAGS`, or `SCIAD_SMALL_LOOP_BYTES`
set (a number of bytes, or 0 to leave XLA's threshold), sciad uses it or
leaves the flag alone. If JAX's backend started before sciad was imported,
the flag cannot take effect; `loops_policy` says what decided.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import weakref

import jax

from . import _cache, _startup

enable_checks: bool  # a property of this module (see `_Config`), False at first
analysis_cache_budget: int  # a property of this module (see `_Config`)

_checks = False
# objects compiled per setting of `enable_checks` (`sd.function`s): told when
# it changes, so a call never runs a program traced under the other setting
_watchers: "weakref.WeakSet" = weakref.WeakSet()


def watch_checks(obj) -> None:
    """Calls `obj._checks_changed()` whenever `enable_checks` changes (held
    weakly)."""
    _watchers.add(obj)


class _Config(types.ModuleType):
    @property
    def enable_checks(self) -> bool:
        return _checks

    @enable_checks.setter
    def enable_checks(self, value) -> None:
        global _checks
        value = bool(value)
        if value != _checks:
            _checks = value
            for obj in list(_watchers):
                obj._checks_changed()


    @property
    def analysis_cache_budget(self) -> int:
        return _cache.budget()

    @analysis_cache_budget.setter
    def analysis_cache_budget(self, value) -> None:
        _cache.set_budget(value)


sys.modules[__name__].__class__ = _Config


def analysis_cache_info() -> "_cache.CacheInfo":
    """What sciad keeps per sparsity pattern: entries, bytes and hits per kind
    (symbolic analyses, AMG hierarchies, index maps, ...), the budget, and
    the caches of the libraries it calls (CHOLMOD's, in sparsax). Printed,
    a table.

    ```python
    T = sd.sparse.from_dense(2 * np.eye(4) - np.eye(4, k=1) - np.eye(4, k=-1))
    sd.linalg.solve(T, np.ones(4), solver="klu")
    print(sd.config.analysis_cache_info())
    # analysis cache: 4 entries, 580 B of a 1.0 GiB budget
    #   coo index map                    1 entries      280 B           hits 0, made 1, dropped 0
    #   index arrays                     2 entries       60 B           hits 2, made 2, dropped 0
    #   klu symbolic                     1 entries      240 B (pinned)  hits 1, made 1, dropped 0
    ```
    """
    return _cache.info()


def clear_analysis_cache(kind: str | None = None) -> None:
    """Empties the analysis cache (only the entries of `kind`, as
    `analysis_cache_info()` names them, where given), and the libraries'
    own caches. Entries a compiled program may still read (KLU's symbolic
    analyses) stay. Made again when next needed.

    ```python
    sd.config.clear_analysis_cache()
    ```
    """
    _cache.clear(kind)


@contextlib.contextmanager
def checks(enabled: bool = True):
    """Temporarily sets `enable_checks`."""
    module = sys.modules[__name__]
    old = module.enable_checks
    module.enable_checks = enabled
    try:
        yield
    finally:
        module.enable_checks = old


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit dtypes here (globally or in a scope)."""
    return bool(jax.enable_x64.value)


def x64_scope():
    """A context in which JAX keeps 64-bit dtypes (a no-op if already on)."""
    if jax.enable_x64.value:
        return contextlib.nullcontext()
    return jax.enable_x64(True)


_OFF = _startup.OFF


def _x64_at_import() -> str:
    """Turns JAX's x64 mode on unless the environment made a choice; returns
    what decided (shown by `x64_policy`)."""
    choice = os.environ.get("SCIAD_ENABLE_X64")
    if choice is not None:
        if choice.strip().lower() in _OFF:
            return "kept: SCIAD_ENABLE_X64=" + choice
        jax.config.update("jax_enable_x64", True)
        return "on: SCIAD_ENABLE_X64=" + choice
    if "JAX_ENABLE_X64" in os.environ:
        return "kept: JAX_ENABLE_X64=" + os.environ["JAX_ENABLE_X64"]
    jax.config.update("jax_enable_x64", True)
    return "on: turned on when sciad was imported"


x64_policy: str = _x64_at_import()
"""How JAX's x64 mode was set when sciad was imported, as a sentence (e.g.
"on: turned on when sciad was imported")."""

constants_policy: str = _startup.policy
"""How JAX's handling of large constants was set when sciad was imported,
as a sentence (e.g. "on: turned on when sciad was imported", or "off: JAX
was imported before sciad; ...")."""

loops_policy: str = _startup.loops_policy
"""How XLA's compilation of small loops was set when sciad was imported, as
a sentence (e.g. "on: loops touching under 65536 bytes a pass (turned on
when sciad was imported)", "kept: XLA_FLAGS sets xla_backend_extra_options",
or "off: JAX's backend started before sciad was imported; ...")."""
