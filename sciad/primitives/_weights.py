"""`weights_check`: NumPy's checks of weights (`average`'s, `quantile`'s) on
traced values, when the program runs.

The node returns its operand unchanged, tied to a host check that runs only
where a measure fails: a negative weight (`nonnegative`), or a sum along
`axes` that is zero (`nonzero_sum`; each sum over those axes is one
normalization: `numpy.average` passes its `axis`, all axes for None).
Its derivative is the identity's, so a weighted average stays as
differentiable in its weights as before.

```python
w = weights_check_p.bind(w, axes=(1,), nonnegative=False, nonzero_sum=True)
```
"""

from __future__ import annotations

import jax.numpy as jnp

from ..errors import DTypeError, InvalidOptionError, ZeroSumError
from ..graph import Param, Primitive, TensorType
from ..graph._batch import front_rule
from ..graph._sparsity import elementwise
from ._checks import check, tie

weights_check_p = Primitive("weights_check", runtime_checks=True, params={
    "axes": Param(tuple, default=()), "nonnegative": Param(bool, default=False),
    "nonzero_sum": Param(bool, default=False), "of": Param(str, default="")})
#: (`of`: the NumPy function whose weights these are, named in the error)


@weights_check_p.def_abstract_eval
def _weights_check_type(w, *, axes=(), nonnegative=False, nonzero_sum=False, of=""):
    if not isinstance(w, TensorType) or w.dtype.kind not in "fiub":
        raise DTypeError(f"weights must be a real array, got "
                         f"{getattr(w, 'str_short', lambda: w)()}.", op="weights_check")
    if any(not 0 <= a < w.ndim for a in axes):
        raise InvalidOptionError(f"`axes` {axes} out of range for {w.str_short()}.",
                                 op="weights_check")
    return w


def _judge_weights(site, *, of="", negative=False, zero_sum=False):
    whose = f"{of}'s weights" if of else "the weights"
    if negative:
        site.fail(InvalidOptionError, f"{whose} must be non-negative, and one is negative "
                  "(NumPy raises ValueError); pass weights >= 0.")
    if zero_sum:
        site.fail(ZeroSumError, f"{whose} sum to zero, so they can't be normalized (NumPy's "
                  "ZeroDivisionError); pass weights with a nonzero sum along `axis`.")


@weights_check_p.def_impl
def _weights_check_impl(w, *, axes=(), nonnegative=False, nonzero_sum=False, of="",
                        site=None):
    measures = {}
    if nonnegative:
        measures["negative"] = jnp.any(w < 0)
    if nonzero_sum:
        total = jnp.sum(w, axis=tuple(axes))
        measures["zero_sum"] = jnp.any(total == 0)
    if not measures:
        return w
    failing = measures.get("negative", False) | measures.get("zero_sum", False)
    return tie(w, check(_judge_weights, site, when=failing, of=of, **measures))


@weights_check_p.def_jvp
def _weights_check_jvp(primals, tangents, **params):
    (w,), (dw,) = primals, tangents
    return weights_check_p.bind(w, **params), dw


weights_check_p.def_batch(front_rule(weights_check_p, shift=lambda axes=(), **p: dict(
    p, axes=tuple(a + 1 for a in axes))))


@weights_check_p.def_sparsity
def _weights_check_sparsity(outs, w, **params):
    return elementwise(outs[0], w)
