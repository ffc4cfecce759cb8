"""Contractions: `matmul` (NumPy's `@`, with batch broadcasting and 1-D
operands) and `einsum` (an explicit `spec` such as `'ij,jk->ik'`)."""

from __future__ import annotations

import jax.numpy as jnp

from ..errors import ShapeError
from ..graph import Primitive, TensorType
from ._util import broadcast_shapes, same_dtype, tensor

matmul_p = Primitive("matmul")


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


einsum_p = Primitive("einsum")


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
