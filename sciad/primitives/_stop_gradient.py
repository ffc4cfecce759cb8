"""`stop_gradient(x)`: `x` itself, treated as a constant by differentiation.

JAX's `jax.lax.stop_gradient`: the identity on values, with a zero
derivative in forward mode, reverse mode and at every order (the JVP rule
returns a symbolic zero, the VJP rule no cotangent, so nothing flows through
the node). Dense and sparse operands of any dtype; the public `stop_gradient`
binds it on float and complex values only and passes the others through, as
JAX does.

Passes leave the node where it is: `simplify` has no rewrite for it, and
`fold_constants` folds it only on a constant, whose derivative is zero
anyway. A graph differentiated after `optimize` so has the same derivatives
as before it.

`sd.testing.check_rules(stop_gradient_p, x)` fails by design: finite
differences see the identity. Check it where it is used as intended, on a
value that does not change the result (the shift of a log-sum-exp; see
tests/registry_examples.py).
"""

from __future__ import annotations

import jax
import numpy as np

from ..errors import DTypeError
from ..graph import Primitive, SparseType, TensorType, Zero
from ..graph._autodiff import type_of
from ..graph._batch import elementwise_rule
from ..graph._sparsity import empty
from ..graph._trace import is_value_leaf

stop_gradient_p = Primitive("stop_gradient", params={})


@stop_gradient_p.def_abstract_eval
def _stop_gradient_shape(x):
    if not isinstance(x, (TensorType, SparseType)):
        raise DTypeError(f"takes a dense or sparse array, got {x.str_short()}.",
                         op="stop_gradient")
    return x


@stop_gradient_p.def_impl
def _stop_gradient_lower(x):
    # JAX's own stop_gradient, so a JAX transform of the lowered program (and
    # not only sciad's) sees a zero derivative too
    return jax.lax.stop_gradient(x)


@stop_gradient_p.def_jvp
def _stop_gradient_jvp(primals, tangents):
    # d stop_gradient(x) = 0, whatever the tangent of x
    (x,), _ = primals, tangents
    y = stop_gradient_p.bind(x)
    return y, Zero(type_of(y).update())


@stop_gradient_p.def_vjp
def _stop_gradient_vjp(primals, out, ct):
    # the transpose of the zero map: no cotangent for x
    return (None,)


def stop_gradient(x):
    """`x`, with a zero derivative (JAX's `jax.lax.stop_gradient`).

    The values pass through unchanged; `sd.grad`, `sd.jvp`, `sd.vjp` and the
    other transforms treat them as constants, at every order:
    `sd.grad(lambda x: x * sd.stop_gradient(x))(3.0) == 3.0`. One
    `stop_gradient` node per float or complex array in the graph.

    **Arguments:**

    - `x`: an array (dense or sparse, traced or concrete) or a pytree of them.
        Integer and boolean arrays, which carry no derivative, are returned as
        they are.

    **Returns:**

    `x`, with the same structure, shapes and dtypes.
    """
    return jax.tree_util.tree_map(_stop_one, x, is_leaf=is_value_leaf)


def _stop_one(x):
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype  # a Python scalar
    return stop_gradient_p.bind(x) if np.dtype(dtype).kind in "fc" else x


def _install_batch_rule() -> None:
    stop_gradient_p.def_batch(elementwise_rule(stop_gradient_p))


_install_batch_rule()


@stop_gradient_p.def_sparsity
def _stop_gradient_sparsity(outs, x):
    # no derivative flows through: structurally zero

    return empty(x.size, x.columns)
