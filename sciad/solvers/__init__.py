"""Numerical backends that lowering calls: plain JAX code, no graphs.

Each solver returns its result together with what a caller needs to detect
failure (pivots, residuals, iteration counts); turning that into an error is
the primitives' business.
"""

from . import _dense as dense
from . import _iterative as iterative
from . import _sparse_direct as sparse_direct

__all__ = ["dense", "iterative", "sparse_direct"]
