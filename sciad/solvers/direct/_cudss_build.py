"""Builds sciad's cuDSS extension (`csrc/cudss_ffi.cc`) on first use and
caches it: a plain shared library (no Python API), compiled with the system
C++ compiler against the headers of the `[cuda]` extra's wheels and
jaxlib's XLA FFI headers (`jax.ffi.include_dir()`), and loaded with ctypes.

Where it goes: `$SCIAD_CACHE_DIR` or `~/.cache/sciad`, under
`cudss/<key>/libsciad_cudss.so`, `key` a hash of the source, jaxlib's
version, the compiler and the wheels' folders (a new jaxlib or a new wheel
builds again; an unchanged one loads the cached file). The build writes a
temporary file and renames it, so concurrent first uses are safe.

Linked, not dlopen'ed: the library links `libcudss.so.N` and
`libcudart.so.M` from the wheels (CUDA 12's `nvidia/cu12`,
`nvidia/cuda_runtime`, `nvidia/cuda_nvcc`; CUDA 13's `nvidia/cu13`; the
runtime may come from a system toolkit, `$CUDA_HOME` or /usr/local/cuda), the
CUDA major version JAX's plugin uses first, with their folders as its rpath
(and cuBLAS's, which libcudss loads). A missing or mismatched runtime then fails
when the library loads, with the loader's message, instead of at a first
kernel call; the key changes with the wheels' folders, so the rpath is never
stale. It needs no GPU to build or load (`sciad_cudss_version` answers on
any machine); its kernels need one.

```python
lib = library()                 # ctypes.CDLL; builds on first use
lib.sciad_cudss_version()       # 10000 for cuDSS 1.0.0
```
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from pathlib import Path

from ...errors import NotSupportedError
from .. import _build

SOURCE = Path(__file__).parent.parent / "csrc" / "cudss_ffi.cc"
WHAT = "solver 'cudss'"

#: what to install where the extra is missing
INSTALL = ("install the extra: `pip install 'sciad[cuda]'` (the wheels nvidia-cudss-cu12, "
           "nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12) with `pip install "
           "'jax[cuda12]'`, or for JAX on CUDA 13 `pip install 'sciad[cuda13]' 'jax[cuda13]'` "
           "(nvidia-cudss-cu13, nvidia-cuda-runtime and nvidia-cuda-crt)")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _nvidia_dirs() -> list[Path]:
    """The `nvidia/` folders of the installed wheels: the namespace package's,
    and any on `sys.path` (a wheel installed with `--target` elsewhere)."""
    spec = importlib.util.find_spec("nvidia")
    found = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    found += [Path(p, "nvidia") for p in sys.path if p and Path(p, "nvidia").is_dir()]
    return list(dict.fromkeys(found))


def _majors() -> list[str]:
    """CUDA major versions to look for, JAX's own first (its CUDA plugin)."""
    order = ["12", "13"]
    for major in ("13", "12"):
        if importlib.util.find_spec(f"jax_cuda{major}_plugin") is not None:
            return [major] + [m for m in order if m != major]
    return order


def _toolkits() -> list[Path]:
    """System CUDA toolkits ($CUDA_HOME, /usr/local/cuda): a fallback for the
    runtime's headers and library."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [Path(r) for r in roots if r and Path(r, "include", "cuda_runtime.h").is_file()]


def _first(candidates) -> Path | None:
    return next((c for c in candidates if c.is_file()), None)


def _so(folder: Path, stem: str, major: str | None = None) -> Path | None:
    """`folder/<stem>.so.<N>` (N = `major` where given, else any)."""
    if major is not None:
        return _first([folder / f"{stem}.so.{major}"])
    found = sorted(folder.glob(f"{stem}.so.[0-9]*")) if folder.is_dir() else []
    return found[0] if found else None


def paths() -> dict:
    """What the build needs, for the first CUDA major version (JAX's own
    first) whose cuDSS wheel is installed: `includes` (folders: cuDSS's, the
    CUDA runtime's, the one holding its `crt/`), `libs` (the files
    libcudss.so.N and libcudart.so.M to link) and `rpath` (their folders and
    cuBLAS's). None found raises `NotSupportedError` naming what is missing."""
    roots = _nvidia_dirs()
    missing = "nvidia-cudss-cu12 (or -cu13)"
    for major in _majors():
        sub = f"cu{major}"
        cudss_h = _first([r / d / "include" / "cudss.h" for r in roots for d in (sub, "cudss")])
        if cudss_h is None:
            continue
        cudss_so = _so(cudss_h.parent.parent / "lib", "libcudss")
        # the runtime: its wheel (cu12: nvidia/cuda_runtime; cu13: nvidia/cu13), or a toolkit
        rt_dirs = [r / d for r in roots for d in ("cuda_runtime", sub)] + _toolkits()
        rt_h = _first([d / "include" / "cuda_runtime.h" for d in rt_dirs])
        rt_so = next((x for d in rt_dirs for x in (_so(d / "lib", "libcudart", major),
                                                    _so(d / "lib64", "libcudart", major)) if x),
                     None)
        crt = _first([d / "include" / "crt" / "host_config.h"
                      for d in [r / x for r in roots for x in ("cuda_nvcc", sub, "cuda_crt")]
                      + rt_dirs])
        missing = ", ".join(name for name, got in (
            ("libcudss.so (the cuDSS wheel)", cudss_so),
            (f"cuda_runtime.h (nvidia-cuda-runtime-cu{major})", rt_h),
            (f"libcudart.so.{major} (nvidia-cuda-runtime-cu{major})", rt_so),
            (f"crt/host_config.h (nvidia-cuda-nvcc-cu{major})", crt)) if got is None)
        if missing:
            continue
        blas = [r / d / "lib" for r in roots for d in ("cublas", sub)
                if _so(r / d / "lib", "libcublas", major)]
        includes = list(dict.fromkeys([cudss_h.parent, rt_h.parent, crt.parent.parent]))
        rpath = list(dict.fromkeys([cudss_so.parent, rt_so.parent, *blas]))
        return {"major": major, "includes": includes, "libs": [cudss_so, rt_so],
                "rpath": rpath}
    raise NotSupportedError(f"solver 'cudss' is not available: the CUDA wheels' files are "
                            f"missing ({missing}); {INSTALL}.")


def compiler() -> str:
    """The C++ compiler (`$CXX`, else g++ or c++); `NotSupportedError` if none."""
    return _build.compiler(WHAT)


def flags(p: dict) -> list[str]:
    """What the compiler adds for cuDSS: the wheels' headers, the two
    libraries, and an rpath to their folders."""
    return [*(f"-I{d}" for d in p["includes"]),
            *(f"-L{f.parent}" for f in p["libs"]), *(f"-l:{f.name}" for f in p["libs"]),
            f"-Wl,-rpath,{':'.join(str(d) for d in p['rpath'])}"]


def _key(p: dict) -> list[str]:
    return [str(x) for x in p["includes"] + p["libs"] + p["rpath"]]


def target() -> Path:
    """Where the built library is cached (see the module docstring)."""
    p = paths()
    return _build.target(SOURCE, "cudss", "libsciad_cudss.so", _key(p), WHAT)


def build(force: bool = False) -> Path:
    """Compiles the extension into its cache path (unless there already);
    returns the path. A failed compile raises `NotSupportedError` with the
    compiler's message."""
    p = paths()
    return _build.cached_build(SOURCE, "cudss", "libsciad_cudss.so", flags(p), _key(p),
                               WHAT, force)


def library() -> ctypes.CDLL:
    """The loaded extension (built on first use), with its C entry points'
    signatures set."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL(str(build()))
            except OSError as e:
                raise NotSupportedError(f"solver 'cudss': its extension does not load ({e}); "
                                        f"{INSTALL}.") from None
            lib.sciad_cudss_pattern.restype = ctypes.c_uint64
            lib.sciad_cudss_pattern.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                                ctypes.c_void_p, ctypes.c_int]
            lib.sciad_cudss_live_factors.restype = ctypes.c_int64
            lib.sciad_cudss_pooled.restype = ctypes.c_int64
            lib.sciad_cudss_pooled.argtypes = [ctypes.c_uint64]
            lib.sciad_cudss_version.restype = ctypes.c_int
            lib.sciad_cudss_batch_fallbacks.restype = ctypes.c_int64
            lib.sciad_cudss_batch_status.restype = ctypes.c_int
            lib.sciad_cudss_batch_status.argtypes = [ctypes.c_char_p, ctypes.c_int64]
            lib.sciad_cudss_set_batch.argtypes = [ctypes.c_int]
            lib.sciad_cudss_release.argtypes = [ctypes.c_void_p, ctypes.c_int64]
            _lib = lib
    return _lib
