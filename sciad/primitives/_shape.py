"""Structural primitives: `reshape`, `transpose`, `broadcast_to`,
`concatenate`, `pad`, `roll`. All are linear in their array operands."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import ShapeError
from ..graph import Primitive, TensorType, instantiate, is_linear
from ..graph._batch import front_rule, shift_axes, to_front
from ..graph._sparsity import moves
from ._util import INTS, SCALAR, if_same_type, normalize_axis, same_dtype, tensor, unbroadcast

reshape_p = Primitive("reshape", params={"shape": INTS})


@reshape_p.def_abstract_eval
def _reshape_shape(x, *, shape):
    x = tensor(x, "reshape")
    shape = tuple(shape)
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise ShapeError(f"`shape` must be non-negative ints, got {shape}.", op="reshape")
    size = int(np.prod(shape, dtype=np.int64))
    if size != x.size:
        raise ShapeError(f"cannot reshape {x.str_short()} ({x.size} elements) into shape "
                         f"{shape} ({size} elements).", op="reshape")
    return TensorType(shape, x.dtype)


@reshape_p.def_impl
def _reshape_impl(x, *, shape):
    return jnp.reshape(x, shape)


@reshape_p.def_simplify
def _reshape_simplify(node, producer):
    # reshape(reshape(x, s1), s2) -> reshape(x, s2); a reshape to x's own shape -> x
    inner = producer(node.inputs[0])
    if inner is not None and inner.primitive is reshape_p:
        x = inner.inputs[0]
        return x if if_same_type(x, node) else node.replace(inputs=(x,))
    return if_same_type(node.inputs[0], node)


transpose_p = Primitive("transpose", params={"perm": INTS})


@transpose_p.def_abstract_eval
def _transpose_shape(x, *, perm):
    x = tensor(x, "transpose")
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"`perm` {perm} is not a permutation of the {x.ndim} axes of "
                         f"{x.str_short()}.", op="transpose")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


@transpose_p.def_impl
def _transpose_impl(x, *, perm):
    return jnp.transpose(x, perm)


@transpose_p.def_simplify
def _transpose_simplify(node, producer):
    # transpose(transpose(x, p1), p2) -> transpose(x, p1[p2]); by the identity -> x
    perm, x = tuple(node.params["perm"]), node.inputs[0]
    inner = producer(x)
    if inner is not None and inner.primitive is transpose_p:
        first = tuple(inner.params["perm"])
        x, perm = inner.inputs[0], tuple(first[p] for p in perm)
        if perm != tuple(range(len(perm))):
            return node.replace(inputs=(x,), params={**node.params, "perm": perm})
    return if_same_type(x, node) if perm == tuple(range(len(perm))) else None


broadcast_to_p = Primitive("broadcast_to", params={"shape": INTS})


@broadcast_to_p.def_abstract_eval
def _broadcast_to_shape(x, *, shape):
    x = tensor(x, "broadcast_to")
    shape = tuple(shape)
    ok = len(shape) >= x.ndim and all(
        d == 1 or d == s for d, s in zip(x.shape[::-1], shape[::-1]))
    if not ok:
        raise ShapeError(f"cannot broadcast {x.str_short()} to shape {shape}.",
                         op="broadcast_to")
    return TensorType(shape, x.dtype)


@broadcast_to_p.def_impl
def _broadcast_to_impl(x, *, shape):
    return jnp.broadcast_to(x, shape)


@broadcast_to_p.def_simplify
def _broadcast_to_simplify(node, producer):
    # a broadcast to the operand's own shape
    return if_same_type(node.inputs[0], node)


concatenate_p = Primitive("concatenate", params={"axis": int})


@concatenate_p.def_abstract_eval
def _concatenate_shape(*xs, axis):
    if not xs:
        raise ShapeError("needs at least one array.", op="concatenate")
    xs = [tensor(x, "concatenate") for x in xs]
    dtype = same_dtype(xs, "concatenate")
    nd = xs[0].ndim
    if nd == 0:
        raise ShapeError("zero-dimensional arrays cannot be concatenated.",
                         op="concatenate")
    axis = normalize_axis(axis, nd, "concatenate")
    for x in xs[1:]:
        if x.ndim != nd or any(a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape))
                               if i != axis):
            raise ShapeError(
                f"all arrays must match except along axis {axis}, got "
                f"{', '.join(t.str_short() for t in xs)}.", op="concatenate")
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return TensorType(tuple(shape), dtype)


@concatenate_p.def_impl
def _concatenate_impl(*xs, axis):
    return jnp.concatenate(xs, axis=axis)


# `pad(x, widths=((lo, hi), ...), value=c)`: constant padding.
pad_p = Primitive("pad", params={"widths": tuple[tuple[int, int], ...],
                                 "value": SCALAR})


@pad_p.def_abstract_eval
def _pad_shape(x, *, widths, value):
    x = tensor(x, "pad")
    if len(widths) != x.ndim or any(len(w) != 2 or min(w) < 0 for w in widths):
        raise ShapeError(f"`widths` needs one non-negative (before, after) pair per axis "
                         f"of {x.str_short()}, got {widths}.", op="pad")
    return TensorType(tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, widths)), x.dtype)


@pad_p.def_impl
def _pad_impl(x, *, widths, value):
    return jnp.pad(x, widths, mode="constant", constant_values=value)


# `roll(x, shifts=(...), axes=(...))`: NumPy's roll along the given axes.
roll_p = Primitive("roll", params={"shifts": INTS, "axes": INTS})


@roll_p.def_abstract_eval
def _roll_shape(x, *, shifts, axes):
    x = tensor(x, "roll")
    if len(shifts) != len(axes):
        raise ShapeError(f"`shifts` {shifts} and `axes` {axes} differ in length.", op="roll")
    for a in axes:
        normalize_axis(a, x.ndim, "roll")
    return x.update()


@roll_p.def_impl
def _roll_impl(x, *, shifts, axes):
    return jnp.roll(x, shifts, axes)


# ---------------------------------------------------------------------------
# Derivative rules: every op here is linear in its array operands, so its JVP
# applies the op to the tangents and its transpose undoes the data movement.

def _linear_jvp(prim):
    def jvp(primals, tangents, **params):
        ts = [instantiate(t) for t in tangents]
        return prim.bind(*primals, **params), prim.bind(*ts, **params)
    return jvp


for _p in (reshape_p, transpose_p, broadcast_to_p, concatenate_p, roll_p):
    _p.def_jvp(_linear_jvp(_p))


@pad_p.def_jvp
def _pad_jvp(primals, tangents, *, widths, value):
    # pad(x, c) is affine in x: the padding constant has no tangent
    (x,), (t,) = primals, tangents
    return pad_p.bind(x, widths=widths, value=value), pad_p.bind(
        t, widths=widths, value=np.zeros((), t.dtype).item())


@reshape_p.def_transpose
def _reshape_transpose(ct, x, *, shape):
    return (reshape_p.bind(ct, shape=x.shape),)


@transpose_p.def_transpose
def _transpose_transpose(ct, x, *, perm):
    return (transpose_p.bind(ct, perm=tuple(int(i) for i in np.argsort(perm))),)


@broadcast_to_p.def_transpose
def _broadcast_to_transpose(ct, x, *, shape):
    return (unbroadcast(ct, x.shape),)


@concatenate_p.def_transpose
def _concatenate_transpose(ct, *xs, axis):
    out, start = [], 0
    for x in xs:
        size = x.shape[axis]
        if is_linear(x):
            idx = tuple(slice(start, start + size) if i == axis else slice(None)
                        for i in range(len(x.shape)))
            out.append(ct[idx])
        else:
            out.append(None)
        start += size
    return tuple(out)


@pad_p.def_transpose
def _pad_transpose(ct, x, *, widths, value):
    idx = tuple(slice(lo, lo + d) for (lo, _), d in zip(widths, x.shape))
    return (ct[idx],)


@roll_p.def_transpose
def _roll_transpose(ct, x, *, shifts, axes):
    # roll(ct, -s) along each axis, written as JAX's AD writes the transpose
    # of its roll (a concatenate of two slices): the two slices of `ct`,
    # zero-padded back into place, added. XLA on the CPU fuses pads and adds
    # into the ops around them, but runs a roll's concatenate on its own: in
    # bench/spectral.py's gradient, that cost an extra 2 arrays of temporaries.

    for shift, axis in zip(shifts, axes):
        n = ct.shape[axis]
        s = shift % n if n else 0             # out[i] = ct[(i + s) % n]
        if s == 0:
            continue
        head = (slice(None),) * axis
        widths_hi = [(0, 0)] * len(ct.shape)
        widths_lo = [(0, 0)] * len(ct.shape)
        widths_hi[axis] = (0, s)              # ct[s:] moves to the front
        widths_lo[axis] = (n - s, 0)          # ct[:s] to the back
        ct = ops.pad(ct[head + (slice(s, n),)], widths_hi) + \
            ops.pad(ct[head + (slice(0, s),)], widths_lo)
    return (ct,)


# ---------------------------------------------------------------------------
# Batch rules: the batch axis leads; the params describe one more axis.

def _install_batch_rules() -> None:
    def reshape_rule(args, dims, *, shape):
        (x,), (d,) = args, dims
        x = to_front(x, d)
        return reshape_p.bind(x, shape=(x.shape[0],) + tuple(shape)), 0

    def broadcast_rule(args, dims, *, shape):
        (x,), (d,) = args, dims
        x = to_front(x, d)
        b, rest = x.shape[0], tuple(x.shape[1:])
        x = ops.reshape(x, (b,) + (1,) * (len(shape) - len(rest)) + rest)
        return broadcast_to_p.bind(x, shape=(b,) + tuple(shape)), 0

    reshape_p.def_batch(reshape_rule)
    broadcast_to_p.def_batch(broadcast_rule)
    transpose_p.def_batch(front_rule(transpose_p, lambda perm: {
        "perm": (0,) + tuple(int(p) + 1 for p in perm)}))
    concatenate_p.def_batch(front_rule(concatenate_p, shift_axes("axis")))
    pad_p.def_batch(front_rule(pad_p, lambda widths, value: {
        "widths": ((0, 0),) + tuple(tuple(w) for w in widths), "value": value}))
    roll_p.def_batch(front_rule(roll_p, shift_axes("axes")))


_install_batch_rules()


# ---------------------------------------------------------------------------
# Sparsity: these ops move elements; their implementations, run on element
# ids, say where each output element comes from (a pad's fill: from nowhere).

def _install_sparsity_rules() -> None:
    for p in (reshape_p, transpose_p, broadcast_to_p, concatenate_p, roll_p):
        p.def_sparsity(moves(p.impl_rule))
    pad_p.def_sparsity(moves(pad_p.impl_rule, value=-1))


_install_sparsity_rules()
