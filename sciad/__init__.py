"""sciad: differentiable scientific primitives on a typed graph IR, lowered to JAX/XLA.

```python
import sciad as sd
import sciad.numpy as snp

g = sd.trace(f, x, y)      # the graph: print(g), g.to_dot(), g.to_json()
f_fast = sd.function(f)    # compiled by XLA, cached per input signature
```

`sciad.fem` (built on scikit-fem) is imported on first use, `sd.fem` or
`import sciad.fem`: `import sciad` loads neither it nor scikit-fem.
"""

from . import _startup  # (before anything imports JAX)
from . import _traceback
from . import config as config, errors as errors, graph as graph, primitives as primitives
from . import numpy as numpy
from . import sparse as sparse
from . import linalg as linalg
from . import fft as fft
from . import optimize as optimize
from . import ode as ode
from . import testing as testing
from . import _numpy_interop
from ._function import Function as Function, function as function
from ._jax_interop import to_jax as to_jax
from .graph import Graph as Graph, TensorType as TensorType
from .graph import primitive as primitive, trace as trace
from .primitives import call as call, primitive_from_jax as primitive_from_jax
from .primitives import stop_gradient as stop_gradient
from .primitives import Binomial as Binomial, EveryK as EveryK, MemoryBudget as MemoryBudget, fori_loop as fori_loop, scan as scan
from .primitives import Segments as Segments, TwoLevel as TwoLevel
from .primitives import checkpoint as checkpoint, cond as cond, while_loop as while_loop
from .graph._cost import cost as cost
from ._info import show_config as show_config
from ._transforms import (
    grad as grad,
    hvp as hvp,
    jacfwd as jacfwd,
    jacrev as jacrev,
    jvp as jvp,
    value_and_grad as value_and_grad,
    vjp as vjp,
    vmap as vmap,
)

__version__ = "0.1.0"

_traceback.register_with_jax()
_traceback.wrap_public(numpy, linalg, fft, sparse, optimize)  # (fem: when it is imported)
_numpy_interop.install()  # (the table names the wrapped functions)

#: submodules imported on first access (PEP 562): `sd.fem` loads scikit-fem
_LAZY_SUBMODULES = ("fem",)


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")  # (also binds `sciad.<name>`)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
