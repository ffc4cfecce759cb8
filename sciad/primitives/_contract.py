"""Contractions: `matmul` (NumPy's `@`, with batch broadcasting and 1-D
operands) and `einsum` (an explicit `spec` such as `'ij,jk->ik'`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import NotSupportedError, ShapeError
from ..graph import Primitive, TensorType, Zero, add_tangents, is_linear
from ..graph._batch import to_front
from ..graph._cost import Cost, size
from ..graph._sparsity import contraction
from ._util import broadcast_shapes, same_dtype, tensor, unbroadcast

matmul_p = Primitive("matmul", params={})


@matmul_p.def_abstract_eval
def _matmul_shape(a, b):
    a, b = tensor(a, "matmul"), tensor(b, "matmul")
    dtype = same_dtype((a, b), "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"operands must have at least one dimension, got {a.str_short()} "
                         f"@ {b.str_short()} (use `*` to multiply by a scalar).", op="matmul")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ShapeError(
            f"cannot multiply {a.str_short()} by {b.str_short()}: the contracted "
            f"dimensions differ ({ka} != {kb}).", op="matmul")
    batch = broadcast_shapes((a.shape[:-2], b.shape[:-2]), "matmul", (a, b))
    shape = batch + (a.shape[-2:-1] if a.ndim >= 2 else ()) + \
        (b.shape[-1:] if b.ndim >= 2 else ())
    return TensorType(shape, dtype)


@matmul_p.def_impl
def _matmul_impl(a, b):
    return jnp.matmul(a, b, precision="highest")


einsum_p = Primitive("einsum", params={"spec": str})


def parse_spec(spec: str, n: int, op: str = "einsum") -> tuple[list[str], str]:
    """`'ij,jk->ik'` -> (['ij', 'jk'], 'ik'), checked."""
    if not isinstance(spec, str) or "->" not in spec:
        raise ShapeError(f"`spec` must be explicit ('ij,jk->ik'), got {spec!r}.", op=op)
    lhs, out = spec.split("->")
    ins = lhs.split(",")
    if len(ins) != n:
        raise ShapeError(f"spec {spec!r} names {len(ins)} operands, got {n}.", op=op)
    for term in ins + [out]:
        if not all(c.isalpha() for c in term):
            raise ShapeError(f"spec {spec!r}: subscripts must be letters (no `...`).",
                             op=op)
    if len(set(out)) != len(out) or not set(out) <= set("".join(ins)):
        raise ShapeError(f"spec {spec!r}: output subscripts must be distinct and appear in "
                         "an input.", op=op)
    return ins, out


@einsum_p.def_abstract_eval
def _einsum_shape(*xs, spec):
    xs = [tensor(x, "einsum") for x in xs]
    dtype = same_dtype(xs, "einsum")
    ins, out = parse_spec(spec, len(xs))
    sizes: dict[str, int] = {}
    for term, x in zip(ins, xs):
        if len(term) != x.ndim:
            raise ShapeError(f"spec term {term!r} has {len(term)} subscripts, but its "
                             f"operand is {x.str_short()}.", op="einsum")
        for c, d in zip(term, x.shape):
            if sizes.setdefault(c, d) != d:
                raise ShapeError(
                    f"subscript {c!r} has size {sizes[c]} in one operand and {d} in "
                    f"another ({', '.join(t.str_short() for t in xs)}, spec {spec!r}).",
                    op="einsum")
    return TensorType(tuple(sizes[c] for c in out), dtype)


@einsum_p.def_impl
def _einsum_impl(*xs, spec):
    return jnp.einsum(spec, *xs, precision="highest")


# ---------------------------------------------------------------------------
# Derivative rules: bilinear, so the JVP is the sum over operands of the op
# with that operand replaced by its tangent; the transpose (one operand
# linear at a time) contracts the cotangent with the other operands. As in
# JAX, nothing is conjugated.

def _multilinear_jvp(prim):
    def jvp(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        tout = None
        for i, t in enumerate(tangents):
            if isinstance(t, Zero):
                continue
            args = list(primals)
            args[i] = t
            term = prim.bind(*args, **params)
            tout = term if tout is None else add_tangents(tout, term)
        return out, tout
    return jvp


matmul_p.def_jvp(_multilinear_jvp(matmul_p))
einsum_p.def_jvp(_multilinear_jvp(einsum_p))


# For operands of at most two dimensions the cotangents are contractions over
# the operand's own axes (`ct @ b.T` as `einsum('mn,kn->mk')`), never an explicit
# transpose of a matrix: XLA runs a contraction over a matrix's first axis
# with one library call, but an explicit transpose followed by a product as
# a copy and a product (measured 2x slower in a 200-step chain, bench/autodiff.py).
_MATMUL_CT_SPECS = {
    # (a.ndim, b.ndim): (spec for ct_a from (ct, b), spec for ct_b from (a, ct))
    (1, 1): (",k->k", "k,->k"),
    (1, 2): ("n,kn->k", "k,n->kn"),
    (2, 1): ("m,k->mk", "mk,m->k"),
    (2, 2): ("mn,kn->mk", "mk,mn->kn"),
}


@matmul_p.def_transpose
def _matmul_transpose(ct, a, b):
    assert not (is_linear(a) and is_linear(b)), "matmul: both operands linear"
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    specs = _MATMUL_CT_SPECS.get((len(a_shape), len(b_shape)))
    if specs is not None:
        if is_linear(a):
            return einsum_p.bind(ct, b, spec=specs[0]), None
        return None, einsum_p.bind(a, ct, spec=specs[1])
    # Batched: work with 2-D (batched) operands: a vector `a` is a 1 x k row, a
    # vector `b` a k x 1 column; the cotangent gets the matching unit axes.
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    ct2 = ops.expand_dims(ct, -2) if len(a_shape) == 1 else ct
    ct2 = ops.expand_dims(ct2, -1) if len(b_shape) == 1 else ct2
    if is_linear(a):
        b_val = ops.reshape(b, b2)
        ct_a = matmul_p.bind(ct2, ops.swapaxes(b_val, -1, -2))
        return ops.reshape(unbroadcast(ct_a, a2), a_shape), None
    a_val = ops.reshape(a, a2)
    ct_b = matmul_p.bind(ops.swapaxes(a_val, -1, -2), ct2)
    return None, ops.reshape(unbroadcast(ct_b, b2), b_shape)


@einsum_p.def_transpose
def _einsum_transpose(ct, *xs, spec):
    ins, out = parse_spec(spec, len(xs))
    lin = [i for i, x in enumerate(xs) if is_linear(x)]
    assert len(lin) == 1, "einsum: exactly one operand may be linear"
    (i,) = lin
    term = ins[i]
    if len(set(term)) != len(term):
        raise NotSupportedError(
            f"reverse mode through a repeated subscript in one operand ({spec!r}, a "
            "diagonal) is not supported; multiply by `ops.eye` instead.", op="einsum")
    others = [(t, x) for j, (t, x) in enumerate(zip(ins, xs)) if j != i]
    avail = set(out).union(*[set(t) for t, _ in others])
    target = "".join(c for c in term if c in avail)
    spec_t = ",".join([t for t, _ in others] + [out]) + "->" + target
    res = einsum_p.bind(*[x for _, x in others], ct, spec=spec_t)
    if target != term:  # letters summed in this operand alone: broadcast back
        shape = tuple(d if c in avail else 1 for c, d in zip(term, xs[i].shape))
        res = ops.broadcast_to(ops.reshape(res, shape), tuple(xs[i].shape))
    cts: list = [None] * len(xs)
    cts[i] = res
    return tuple(cts)


# -- cost (`sd.cost`): a multiply and an add per term of the contraction ---------


@matmul_p.def_cost
def _matmul_cost(node, body):
    a = node.inputs[0].type
    k = a.shape[-1] if a.shape else 1
    return Cost(2.0 * size(node.outputs[0].type) * k)


@einsum_p.def_cost
def _einsum_cost(node, body):
    ins, _ = node.params["spec"].split("->")
    dims: dict[str, int] = {}
    for letters, a in zip(ins.split(","), node.inputs):
        dims.update(zip(letters, a.type.shape))
    terms = float(np.prod([float(d) for d in dims.values()])) if dims else 1.0
    return Cost(2.0 * terms)


# ---------------------------------------------------------------------------
# Batch rules. einsum: a new letter for the batch axis, on the batched
# operands and first in the result. matmul: 1-D operands are made 2-D (as
# matmul reads them), batched ones get the batch axis first and size-1 axes
# so that matmul's own broadcasting of leading axes lines the batch up; the
# added axes are dropped from the result.

def _install_batch_rules() -> None:
    def einsum_rule(args, dims, *, spec):
        ins, out = parse_spec(spec, len(args))
        z = next(c for c in "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA"
                 if c not in spec)
        operands, subs = [], []
        for a, d, s in zip(args, dims, ins):
            if d is None:
                operands.append(a)
                subs.append(s)
            else:
                operands.append(to_front(a, d))
                subs.append(z + s)
        return einsum_p.bind(*operands, spec=",".join(subs) + "->" + z + out), 0

    def matmul_rule(args, dims):
        (a, b), (da, db) = args, dims
        ra, rb = len(a.shape) - (da is not None), len(b.shape) - (db is not None)

        def two_d(x, d, r, where):
            if r != 1:
                return x, d
            x = to_front(x, d) if d is not None else x
            lead = tuple(x.shape[:-1])
            k = x.shape[-1]
            return ops.reshape(x, lead + ((1, k) if where == "row" else (k, 1))), \
                (None if d is None else 0)

        a, da = two_d(a, da, ra, "row")
        b, db = two_d(b, db, rb, "col")
        n = max(len(a.shape) - (da is not None), len(b.shape) - (db is not None)) - 2
        operands = []
        for x, d in ((a, da), (b, db)):
            if d is None:
                operands.append(x)
                continue
            x = to_front(x, d)
            k = len(x.shape) - 3
            operands.append(ops.reshape(x, (x.shape[0],) + (1,) * (n - k) + tuple(x.shape[1:])))
        out = matmul_p.bind(*operands)
        if ra == 1:
            out = ops.squeeze(out, axis=-2)
        if rb == 1:
            out = ops.squeeze(out, axis=-1)
        return out, 0

    einsum_p.def_batch(einsum_rule)
    matmul_p.def_batch(matmul_rule)


_install_batch_rules()


# ---------------------------------------------------------------------------
# Sparsity: an output element depends on the operand elements of the terms
# summed into it, leaving out terms with a constant zero factor (a constant
# stencil's zeros stay zeros).

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@einsum_p.def_sparsity
def _einsum_sparsity(outs, *deps, spec):
    return contraction(outs[0], spec, *deps)


@matmul_p.def_sparsity
def _matmul_sparsity(outs, a, b):
    batch = len(outs[0].shape) - (len(a.shape) >= 2) - (len(b.shape) >= 2)
    lb = _LETTERS[:batch]
    m, j, k = "xyz"
    ta = lb[batch - (len(a.shape) - 2):] + m + j if len(a.shape) >= 2 else j
    tb = lb[batch - (len(b.shape) - 2):] + j + k if len(b.shape) >= 2 else j
    res = lb + (m if len(a.shape) >= 2 else "") + (k if len(b.shape) >= 2 else "")
    return contraction(outs[0], f"{ta},{tb}->{res}", a, b)
