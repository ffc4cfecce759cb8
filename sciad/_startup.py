"""What sciad asks of JAX before JAX is imported (this module imports
nothing of JAX's): the hoisting of large constants, which JAX reads from
the environment when it is first imported. See `sciad.config`, "Large
constants"; `sciad.config.constants_policy` reports what decided."""

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
    if choice is not None and choice.strip().lower() in OFF:
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
