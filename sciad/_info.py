"""`sd.show_config()`: what this install of sciad has and can do here, to
check an install (and to paste into a bug report)."""

from __future__ import annotations

import platform
import sys
from typing import NamedTuple

import numpy as np


class SolverStatus(NamedTuple):
    """One linear solver, as `show_config` reports it."""

    name: str
    matrices: tuple[str, ...]   # the kinds of matrix it takes
    where: str                  # "device" (in the program) or "host" (a host call)
    available: bool
    why: str                    # why not (empty where available)


class ExtensionStatus(NamedTuple):
    """One of sciad's compiled extensions (C++ built on first use)."""

    name: str
    what: str
    built: bool
    why: str                    # why not (empty where built)


class Config(NamedTuple):
    """What `show_config` found: versions, JAX's backend, the compiled
    extensions, the linear solvers, and what `solver="auto"` picks here."""

    versions: dict
    backend: str
    devices: tuple[str, ...]
    x64: bool
    loops: str                  # `sd.config.loops_policy`
    compiler: str | None
    cache_dir: str
    extensions: tuple[ExtensionStatus, ...]
    solvers: tuple[SolverStatus, ...]
    auto: dict                  # matrix kind -> the solver "auto" picks for it

    def __str__(self) -> str:
        v = self.versions
        lines = [f"sciad {v['sciad']} (Python {v['python']}, NumPy {v['numpy']}, "
                 f"SciPy {v['scipy']}, JAX {v['jax']}, jaxlib {v['jaxlib']})",
                 f"JAX backend: {self.backend} ({', '.join(self.devices)}); "
                 f"float64 (x64): {'on' if self.x64 else 'off'}",
                 f"small loops compiled as one function: {self.loops}",
                 f"C++ compiler: {self.compiler or 'none found (set $CXX or install g++)'}; "
                 f"built extensions cached in {self.cache_dir}",
                 "compiled extensions (built on first use):"]
        width = max(len(e.what) for e in self.extensions)
        for e in self.extensions:
            lines.append(f"  {e.what:<{width}}  " + ("built" if e.built else f"no: {e.why}"))
        lines.append("linear solvers (solver=...):")
        width = max(len(s.name) for s in self.solvers)
        for s in self.solvers:
            kinds = "/".join(s.matrices)
            state = "available" if s.available else f"not here: {s.why}"
            lines.append(f"  {s.name:<{width}}  {kinds:<22} {s.where:<6}  {state}")
        lines.append("solver=\"auto\" picks here: " + ", ".join(
            f"{k}: {v!r}" for k, v in self.auto.items())
            + " (sd.linalg.explain_solver(A) says why, for your matrix)")
        return "\n".join(lines)


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "not installed"


def _extensions() -> tuple[ExtensionStatus, ...]:
    from .solvers import _batch_split, _sparse_checks
    from .solvers.direct import _fill_cholesky, _selinv

    out = []
    for lib in (_sparse_checks._LIBRARY, _batch_split._LIBRARY, _fill_cholesky.LIBRARY,
                _selinv.LIBRARY):
        built = lib.get() is not None
        out.append(ExtensionStatus(lib.name, lib.what, built, "" if built else str(lib.failed)))
    return tuple(out)


def _solvers() -> tuple[SolverStatus, ...]:
    from .solvers._linear import MATRICES
    from .solvers._registry import records

    out = []
    for r in records("linear"):
        kinds = tuple(m for m in MATRICES if m in r.matrices)
        why = None
        for kind in kinds:  # (spd: the Cholesky solvers' own matrices)
            found = r.rejects(matrix=kind, dtype=np.float64, tags=frozenset({"spd"}))
            why = None if found is None else found[1]
            if why is None:
                break
        if why is not None:  # (the reason, without the solver's name and the alternatives)
            why = why.replace(f"solver {r.name!r} is not available here: ", "").split(
                ". Use ")[0]
        out.append(SolverStatus(r.name, kinds, r.where, why is None, why or ""))
    return tuple(out)


def _auto() -> dict:
    from .solvers._linear import choose

    out = {}
    for kind, tags in (("dense", frozenset()), ("sparse", frozenset()),
                       ("sparse spd", frozenset({"spd"}))):
        try:
            out[kind] = choose(matrix=kind.split()[0], tags=tags, dtype=np.float64).name
        except AssertionError:  # (no solver applies: reported as such)
            out[kind] = None
    return out


def show_config(file=None) -> Config:
    """Prints what this install of sciad has and can do here, and returns it.

    The versions of sciad and what it runs on, JAX's backend and devices and
    whether float64 is on, whether XLA compiles small loops as one function
    (`sd.config.loops_policy`), the C++ compiler that builds sciad's compiled
    extensions on first use (and whether each one built: this call builds
    them where they are not yet in the cache), every linear solver with the
    matrices it takes and whether it runs here (and why not, with what to
    install), and what `solver="auto"` picks for a dense, a sparse and a
    sparse spd matrix on this device.

    **Arguments:**

    - `file`: where to print (default `sys.stdout`); None prints there.

    **Returns:**

    A `Config` record (`str(config)` is the printout).

    ```python
    import sciad as sd

    config = sd.show_config()    # sciad 0.1.0 (Python 3.11.9, NumPy 2.2.6, ...
    config.backend               # 'cpu'
    config.auto["sparse spd"]    # 'klu' or 'cholmod', by size: see explain_solver
    ```
    """
    import jax

    from . import config as sd_config
    from .solvers import _build

    try:
        compiler = _build.compiler()
    except Exception:  # noqa: BLE001 -- NotSupportedError: none found
        compiler = None
    try:
        backend = jax.default_backend()
        devices = tuple(str(d) for d in jax.devices())
    except RuntimeError as e:  # (no backend could start)
        backend, devices = f"none ({e})", ()
    versions = {"sciad": _version("sciad"), "python": platform.python_version(),
                "numpy": np.__version__, "scipy": _version("scipy"), "jax": jax.__version__,
                "jaxlib": _version("jaxlib")}
    found = Config(versions=versions, backend=backend, devices=devices,
                   x64=sd_config.x64_enabled(), loops=sd_config.loops_policy,
                   compiler=compiler,
                   cache_dir=str(_build.cache_dir()), extensions=_extensions(),
                   solvers=_solvers(), auto=_auto())
    print(found, file=file if file is not None else sys.stdout)
    return found
