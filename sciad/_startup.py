"""What sciad asks of JAX before JAX is imported (this module imports
nothing of JAX's): the hoisting of large constants, which JAX reads from
the environment when it is first imported, and the compilation of small
loops as one function each, which XLA reads from `XLA_FLAGS` when its
backend starts. See `sciad.config`, "Large constants" and "Small loops";
`sciad.config.constants_policy` and `sciad.config.loops_policy` report what
decided."""

from __future__ import annotations

import os
import sys

#: the largest array constant (bytes) left in a program's text, where the
#: compiler may fold it (a kernel's control block, a small stencil); larger
#: ones are passed to the executable as buffers made once. JAX's
#: `jax_embedded_constants_max_bytes`, 32 by default, which would also pass
#: the few-entry arrays that configure a kernel call
EMBEDDED_CONSTANT_BYTES = 1024

#: what turns a switch off in the environment (`SCIAD_...=0`)
OFF = ("0", "false", "no", "off")
_FLAG = "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS"
_BYTES = "JAX_EMBEDDED_CONSTANTS_MAX_BYTES"


def _choose() -> str:
    choice = os.environ.get("SCIAD_HOIST_CONSTANTS")
    if choice is not None and choice.lower() in OFF:
        return "kept: SCIAD_HOIST_CONSTANTS=" + choice
    if choice is None and _FLAG in os.environ:
        return f"kept: {_FLAG}={os.environ[_FLAG]}"
    if "jax" in sys.modules:
        # (JAX reads the switch when it is imported: set now, it would
        # change how programs are traced but not how they are lowered)
        return (f"off: JAX was imported before sciad; set {_FLAG}=1 in the environment, "
                "or import sciad first, to have large constants passed to the executable")
    before = {k: os.environ.get(k) for k in (_FLAG, _BYTES)}
    os.environ[_FLAG] = "1"
    os.environ.setdefault(_BYTES, str(EMBEDDED_CONSTANT_BYTES))
    try:
        import jax  # noqa: F401  (reads the switches now)
    finally:  # (the environment as it was: child processes make their own choice)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    why = "SCIAD_HOIST_CONSTANTS=" + choice if choice is not None else \
        "turned on when sciad was imported"
    return f"on: {why}"


policy: str = _choose()

#: XLA's CPU compiler compiles a `while` loop as one function (no runtime
#: dispatch between its operations) where one pass through its body touches
#: fewer bytes than this, and it holds no library call; 1 KiB by XLA's
#: default. An implicit integrator's step on a few states touches tens of
#: KiB in some 150 operations: dispatched one by one they cost 3-4 us a
#: step, compiled together well under 1 us (Robertson's BDF solve 1.4 ->
#: 0.27 ms)
SMALL_LOOP_BYTES = 65536
_XLA = "XLA_FLAGS"
_EXTRA = "xla_backend_extra_options"
_LOOPS = "SCIAD_SMALL_LOOP_BYTES"


def _choose_loops() -> str:
    choice = os.environ.get(_LOOPS, "").strip() or None  # (set but empty: unset)
    if choice is not None and choice.lower() in OFF:
        return f"kept: {_LOOPS}={choice}"
    size = SMALL_LOOP_BYTES
    if choice is not None:
        try:
            size = int(choice)
        except ValueError:
            size = -1
        if size < 0:
            return (f"off: {_LOOPS}={choice!r} is not a number of bytes (an int, or 0 to leave "
                    "XLA's own threshold)")
    flag = f"--{_EXTRA}=xla_cpu_small_while_loop_byte_threshold={size}"
    current = os.environ.get(_XLA, "")
    if flag in current.split():  # (a child of a process that imported sciad)
        return f"on: loops touching under {size} bytes a pass ({_XLA} holds it already)"
    if _EXTRA in current:
        return f"kept: {_XLA} sets {_EXTRA}"
    if "jax" in sys.modules and _backend_started():
        return (f"off: JAX's backend started before sciad was imported; set {_XLA}={flag} "
                "in the environment, or import sciad first, to have small loops compiled as "
                "one function each")
    # (left in the environment: XLA reads it when its backend starts, which
    # may be after this; a child process inherits it, as it would a user's)
    os.environ[_XLA] = f"{current} {flag}".strip()
    why = f"{_LOOPS}={choice}" if choice is not None else "turned on when sciad was imported"
    return f"on: loops touching under {size} bytes a pass ({why})"


def _backend_started() -> bool:
    """Whether JAX's backend has started (JAX imported already: nothing new
    imported here). A JAX without the private query: taken as started, the
    flag then left alone."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


loops_policy: str = _choose_loops()
