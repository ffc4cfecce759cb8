"""Builds sciad's cuDSS extension (`csrc/cudss_ffi.cc`) on first use and
caches it: a plain shared library (no Python API), compiled with the system
C++ compiler against the headers of the `[cuda]` extra's wheels and
jaxlib's XLA FFI headers (`jax.ffi.include_dir()`), and loaded with ctypes.

Where it goes: `$SCIAD_CACHE_DIR` or `~/.cache/sciad`, under
`cudss/<key>/libsciad_cudss.so`, `key` a hash of the source, jaxlib's
version, the compiler and the wheels' folders (a new jaxlib or a new wheel
builds again; an unchanged one loads the cached file). The build writes a
temporary file and renames it, so concurrent first uses are safe.

Linked, not dlopen'ed: the library links `libcudss.so.1` and
`libcudart.so.12` from the wheels with their folders as its rpath (and
cuBLAS's, which libcudss loads). A missing or mismatched runtime then fails
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
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jaxlib

from ..errors import NotSupportedError

SOURCE = Path(__file__).with_name("csrc") / "cudss_ffi.cc"

#: what to install where the extra is missing
INSTALL = ("install the extra: `pip install 'sciad[cuda]'` (the wheels nvidia-cudss-cu12, "
           "nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12), with JAX's CUDA build "
           "(`pip install 'jax[cuda12]'`)")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _nvidia_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _find(*relative: str) -> Path | None:
    """The first `nvidia/<relative>` file among the installed wheels."""
    for root in _nvidia_dirs():
        for rel in relative:
            if (root / rel).is_file():
                return root / rel
    return None


def paths() -> dict:
    """The folders the build needs: `cudss_include`, `cudss_lib`,
    `cudart_include`, `cudart_lib`, `crt_include` (the CUDA runtime headers'
    `crt/`), `cublas_lib`; a missing one raises `NotSupportedError`."""
    found = {
        "cudss_include": _find("cu12/include/cudss.h", "cudss/include/cudss.h"),
        "cudss_lib": _find("cu12/lib/libcudss.so.1", "cudss/lib/libcudss.so.1"),
        "cudart_include": _find("cuda_runtime/include/cuda_runtime_api.h"),
        "cudart_lib": _find("cuda_runtime/lib/libcudart.so.12"),
        "crt_include": _find("cuda_nvcc/include/crt/host_config.h",
                             "cuda_runtime/include/crt/host_config.h"),
        "cublas_lib": _find("cublas/lib/libcublas.so.12"),
    }
    missing = [k for k, v in found.items() if v is None]
    if missing:
        raise NotSupportedError(f"solver 'cudss' is not available: the CUDA wheels' files "
                                f"({', '.join(missing)}) are not installed; {INSTALL}.")
    out = {k: v.parent for k, v in found.items()}
    out["crt_include"] = out["crt_include"].parent  # (the folder that holds crt/)
    return out


def compiler() -> str:
    """The C++ compiler (`$CXX`, else g++ or c++); `NotSupportedError` if none."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise NotSupportedError("solver 'cudss' builds its extension on first use with a C++ "
                            "compiler, and none was found (set $CXX or install g++).")


def command(p: dict, cxx: str, out: Path) -> list[str]:
    """The compiler's command line (C++17, a shared library, rpath to the wheels)."""
    rpath = ":".join(str(p[k]) for k in ("cudss_lib", "cudart_lib", "cublas_lib"))
    return [cxx, "-std=c++17", "-O2", "-shared", "-fPIC",
            "-w",  # (XLA's FFI headers warn under -Wreturn-type)
            f"-I{jax.ffi.include_dir()}", f"-I{p['cudss_include']}",
            f"-I{p['cudart_include']}", f"-I{p['crt_include']}",
            str(SOURCE), "-o", str(out),
            f"-L{p['cudss_lib']}", f"-L{p['cudart_lib']}", "-l:libcudss.so.1",
            "-l:libcudart.so.12", f"-Wl,-rpath,{rpath}"]


def cache_dir() -> Path:
    return Path(os.environ.get("SCIAD_CACHE_DIR") or Path.home() / ".cache" / "sciad")


def target() -> Path:
    """Where the built library is cached (see the module docstring)."""
    p = paths()
    cxx = compiler()
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (jaxlib.__version__, cxx, *(str(p[k]) for k in sorted(p))):
        h.update(b"\0" + part.encode())
    return cache_dir() / "cudss" / h.hexdigest()[:16] / "libsciad_cudss.so"


def build(force: bool = False) -> Path:
    """Compiles the extension into its cache path (unless there already);
    returns the path. A failed compile raises `NotSupportedError` with the
    compiler's message."""
    out = target()
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        run = subprocess.run(command(paths(), compiler(), Path(tmp)), capture_output=True,
                             text=True)
        if run.returncode != 0:
            raise NotSupportedError("solver 'cudss': building its extension failed:\n"
                                    + run.stderr[-4000:])
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


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
            _lib = lib
    return _lib
