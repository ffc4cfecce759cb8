"""Builds sciad's small C++ extensions on first use, and caches them.

An extension is one source file under `csrc/`, compiled with the system
C++ compiler (`$CXX`, else g++ or c++) into a plain shared library (no
Python API, loaded with ctypes) against jaxlib's XLA FFI headers
(`jax.ffi.include_dir()`) and whatever else its builder adds
(`sciad.solvers.direct._cudss_build`: cuDSS's wheels; `sciad.solvers._batch_split`:
nothing else).

Where it goes: `$SCIAD_CACHE_DIR` or `~/.cache/sciad`, under
`<name>/<key>/lib<...>.so`, `key` a hash of the source, jaxlib's version, the
compiler and the builder's own parts (a new jaxlib or compiler builds again;
an unchanged one loads the cached file). The compiler writes a temporary
file that is then renamed, so concurrent first uses are safe.

```python
out = cached_build(SOURCE, "batch", "libsciad_batch.so", flags,
                   what="sciad's batch splitter")   # compiles once
lib = ctypes.CDLL(str(out))
```
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

import jax
import jaxlib

from ..errors import NotSupportedError


def compiler(what: str = "this extension") -> str:
    """The C++ compiler (`$CXX`, else g++ or c++); `NotSupportedError` naming
    `what` needs it if there is none."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise NotSupportedError(f"{what} builds its extension on first use with a C++ compiler, "
                            "and none was found (set $CXX or install g++).")


def cache_dir() -> Path:
    """Where built extensions are kept: `$SCIAD_CACHE_DIR` or `~/.cache/sciad`."""
    return Path(os.environ.get("SCIAD_CACHE_DIR") or Path.home() / ".cache" / "sciad")


def command(cxx: str, source: Path, out: Path, flags=()) -> list[str]:
    """The compiler's command line: C++17, a shared library, XLA's FFI
    headers, then `flags` (include folders, libraries, an rpath)."""
    return [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread",
            "-w",  # (XLA's FFI headers warn under -Wreturn-type)
            f"-I{jax.ffi.include_dir()}", str(source), "-o", str(out), *map(str, flags)]


def target(source: Path, name: str, filename: str, key_parts=(), what: str = "") -> Path:
    """Where the build of `source` is cached (see the module docstring)."""
    h = hashlib.sha256(Path(source).read_bytes())
    for part in (jaxlib.__version__, compiler(what), *map(str, key_parts)):
        h.update(b"\0" + part.encode())
    return cache_dir() / name / h.hexdigest()[:16] / filename


def cached_build(source: Path, name: str, filename: str, flags=(), key_parts=(),
                 what: str = "this extension", force: bool = False) -> Path:
    """Compiles `source` into its cache path (unless there already, or
    `force`); returns the path. A failed compile raises `NotSupportedError`
    naming `what`, with the compiler's message."""
    out = target(source, name, filename, key_parts, what)
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        run = subprocess.run(command(compiler(what), source, Path(tmp), flags),
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise NotSupportedError(f"{what}: building its extension failed:\n"
                                    + run.stderr[-4000:])
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def on_cpu() -> bool:
    """Whether JAX's default backend is the CPU (where a CPU extension's
    FFI handlers run); False where no backend can be made."""
    try:
        return jax.default_backend() == "cpu"
    except RuntimeError:
        return False


class Library:
    """A C++ extension of sciad's built on first use and loaded with ctypes:
    `get()` is the loaded library (built and `setup(lib)` run once: its
    argument types, its FFI targets), or None where it cannot be built or
    loaded here, `failed` then saying why."""

    def __init__(self, source: Path, name: str, filename: str, what: str,
                 setup: Callable[[ctypes.CDLL], None] = lambda lib: None):
        self.source, self.name, self.filename, self.what = source, name, filename, what
        self.setup = setup
        self.failed: str | None = None
        self._lib = None
        self._lock = threading.Lock()

    def get(self):
        if self._lib is not None or self.failed is not None:
            return self._lib
        with self._lock:
            if self._lib is None and self.failed is None:
                try:
                    lib = ctypes.CDLL(str(cached_build(self.source, self.name, self.filename,
                                                       what=self.what)))
                except (NotSupportedError, OSError) as e:
                    self.failed = str(e)
                    return None
                self.setup(lib)
                self._lib = lib
        return self._lib


def importable(module: str) -> bool:
    """Whether the (compiled) module `module` can be imported here."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def once(fn: Callable[[], None]) -> Callable[[], None]:
    """`fn` run on its first call only, whatever the threads calling it
    (registering a compiled module's FFI targets); a call that raises is
    made again next time."""
    lock = threading.Lock()
    done = False

    @functools.wraps(fn)
    def run() -> None:
        nonlocal done
        if done:
            return
        with lock:
            if not done:
                fn()
                done = True

    return run
