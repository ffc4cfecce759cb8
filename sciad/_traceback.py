"""Tracebacks that end in the user's code, not in sciad's or JAX's internals.

An error raised inside sciad (a shape error found while tracing, a singular
matrix found while running) passes through a dozen or more of sciad's
frames and as many of JAX's. As JAX does for its own, sciad removes them
from the traceback at its API boundaries: the public functions and the
functions `sd.function`, `sd.grad`, ... return. What remains is the user's
call and, inside a traced function, the user's lines down to the failing
call; the error's message already names the operation and the line.

- `SCIAD_TRACEBACK_FILTERING=off` in the environment (read when an error
  passes) keeps every frame; so does JAX's `JAX_TRACEBACK_FILTERING=off` for
  JAX's frames.
- sciad's directory is registered with JAX's own filter, so an error that
  leaves through a JAX boundary (the `jax.jit` object a compiled sciad
  function may call directly, `jax.grad(sd.to_jax(f))`) loses sciad's
  frames too.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Callable, TypeVar

import jax

F = TypeVar("F", bound=Callable)

_SCIAD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

NOTE = ("--------------------\nsciad removed its internal frames (and JAX's) from "
        "this traceback. Set SCIAD_TRACEBACK_FILTERING=off to include them.")
_JAX_NOTE_START = "--------------------\nFor simplicity, JAX has removed"
_JAX_DIR = None


def _jax_dir() -> str:
    global _JAX_DIR
    if _JAX_DIR is None:
        _JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
    return _JAX_DIR


def filtering_on() -> bool:
    """Whether sciad filters tracebacks (`SCIAD_TRACEBACK_FILTERING`, default on)."""
    return os.environ.get("SCIAD_TRACEBACK_FILTERING", "on").strip().lower() not in (
        "off", "0", "false", "no")


def _hidden(filename: str, jax_too: bool) -> bool:
    return (filename.startswith(_SCIAD_DIR) or filename.startswith("<frozen ")
            or (jax_too and filename.startswith(_jax_dir())))


def filter_traceback(tb: types.TracebackType | None) -> tuple[types.TracebackType | None, bool]:
    """`tb` without sciad's frames (and JAX's, unless JAX's filtering is off),
    and whether any frame was removed."""
    jax_too = os.environ.get("JAX_TRACEBACK_FILTERING", "auto").lower() != "off"
    kept, removed = [], False
    while tb is not None:
        if _hidden(tb.tb_frame.f_code.co_filename, jax_too):
            removed = True
        else:
            kept.append(tb)
        tb = tb.tb_next
    if not removed:
        return None, False
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out, True


def _simplify(e: BaseException) -> None:
    tb, removed = filter_traceback(e.__traceback__)
    if not removed:
        return
    e.with_traceback(tb)
    notes = getattr(e, "__notes__", None)
    if notes is not None:  # JAX's note on the same subject, replaced by one note
        notes[:] = [n for n in notes if not str(n).startswith(_JAX_NOTE_START)]
        if NOTE in notes:
            return
    e.add_note(NOTE)


def api_boundary(fn: F) -> F:
    """Wraps `fn` so that an exception leaving it has sciad's frames removed
    from its traceback (see the module docstring)."""

    @functools.wraps(fn)
    def sciad_api_boundary(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if filtering_on():
                _simplify(e)
            raise

    sciad_api_boundary._sciad_boundary = True  # type: ignore[attr-defined]
    return sciad_api_boundary  # type: ignore[return-value]


def wrap_public(*modules: types.ModuleType) -> None:
    """Makes each public function defined in `modules` (named in `__all__`,
    or, without one, any name not starting with `_`) an API boundary."""
    wrapped: dict = {}  # one wrapper per function: aliases (`absolute = abs`) stay one
    for module in modules:
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n in vars(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name, None)
            if (isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__
                    and not getattr(obj, "_sciad_boundary", False)):
                if obj not in wrapped:
                    wrapped[obj] = api_boundary(obj)
                setattr(module, name, wrapped[obj])


def register_with_jax() -> None:
    """Registers sciad's directory with JAX's traceback filter (JAX has no
    public API for it; libraries built on JAX use this one)."""
    if not filtering_on():
        return
    try:
        from jax._src import traceback_util
    except ImportError:  # pragma: no cover  (a JAX without it: no harm)
        return
    register = getattr(traceback_util, "register_exclusion", None)
    if register is not None:
        register(_SCIAD_DIR)
