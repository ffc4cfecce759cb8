"""Checks shared by test files (imported as `helpers`; no tests here)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

import sciad as sd


def tridiagonal(n: int):
    """The sorted CSR matrix `tridiag(-1, 2.5, -1)` of size `n` (spd, well
    conditioned): the matrix the factor-lifetime and failure tests solve."""
    M = sp.csr_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (n, n)))
    M.sort_indices()
    return M


def assert_gradient_matches_fd(f, A, d, *, h: float = 1e-5, rtol: float = 1e-7,
                               forward: bool = False):
    """`sd.grad(f)(A)` (a real scalar `f`) is finite and its pairing with the
    direction `d`, `Re sum(g * d)` (sciad's unconjugated pairing), equals the
    central finite difference of `f` along `d` to `rtol`; with `forward`, so
    does `sd.jvp` along `d` (to 1e-9). Returns the gradient."""
    g = np.asarray(sd.grad(f)(A))
    assert np.all(np.isfinite(g))
    along = float(np.real(np.sum(g * d)))
    fd = (float(f(A + h * d)) - float(f(A - h * d))) / (2 * h)
    np.testing.assert_allclose(along, fd, rtol=rtol)
    if forward:
        _, t = sd.jvp(f, (A,), (d,))
        np.testing.assert_allclose(t, along, rtol=1e-9)
    return g


# ---------------------------------------------------------------------------
# Documented code: the docs' and README's snippets and docstring examples, run


def _shown_value(text: str):
    """A value as a snippet shows it in a comment: a Python literal, a NumPy
    array as printed (`[0.5 1. ]`, `[[ True False] ...]`), or None for prose."""
    import ast
    import re

    for candidate in (text, re.sub(r"(?<=[\w.\]])\s+(?=[-\w.\[])", ", ", text.strip())):
        try:
            return ast.literal_eval(candidate)
        except (ValueError, SyntaxError):
            continue
    return None


def _shown_rtol(shown: str) -> float:
    """The relative tolerance a shown number's digits imply (half a unit in
    the last digit of its shortest mantissa; at least 1e-7): `2.0017` is
    checked to 2.5e-5, `0.3535533905932738` to 1e-7."""
    import re

    # (a zero shows no digits of its own: `[0.  0.9093]` is checked to 5e-5,
    # the zero to the absolute tolerance)
    digits = [len(m.lstrip("-+").replace(".", "").lstrip("0"))
              for m in re.findall(r"[-+]?\d*\.\d+|[-+]?\d+\.?", re.sub(r"e[-+]?\d+", "", shown))]
    digits = [d for d in digits if d]
    return max(1e-7, 0.5 * 10.0 ** (1 - min(digits))) if digits else 1e-7


def _assert_shown(got, shown: str, where: str):
    import re

    if "..." in shown:  # abbreviated: not checked
        return
    value = _shown_value(shown)
    if value is None:
        if re.match(r"[A-Za-z_][\w.]*\(", shown):  # a repr
            assert repr(got) == shown, f"{where}: got {got!r}, shown {shown}"
        return  # prose
    if np.asarray(value).dtype.kind == "b":
        np.testing.assert_array_equal(np.asarray(got), np.asarray(value), err_msg=where)
    elif np.asarray(value).dtype.kind in "iufc":
        np.testing.assert_allclose(np.asarray(got), np.asarray(value),
                                   rtol=_shown_rtol(shown), atol=1e-12, err_msg=where)
    else:
        assert got == value, f"{where}: got {got!r}, shown {shown}"


def run_documented(code: str, namespace: dict, where: str = "snippet") -> str:
    """Runs `code` statement by statement in `namespace`; an expression
    statement followed by a comment showing its value (on its line, or on the
    comment lines right after it) must evaluate to that value. Returns what
    the code printed."""
    import ast
    import contextlib
    import io

    lines = code.splitlines()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for stmt in ast.parse(code).body:
            src = ast.get_source_segment(code, stmt)
            if not isinstance(stmt, ast.Expr):
                exec(compile(ast.Module([stmt], []), where, "exec"), namespace)
                continue
            got = eval(compile(ast.Expression(stmt.value), where, "eval"), namespace)
            tail = lines[stmt.end_lineno - 1][stmt.end_col_offset:].strip()
            comment = [tail[1:].strip()] if tail.startswith("#") else []
            k = stmt.end_lineno  # else the comment lines right below it
            while not tail and k < len(lines) and lines[k].strip().startswith("#"):
                comment.append(lines[k].strip()[1:].strip())
                k += 1
            if comment:
                _assert_shown(got, " ".join(comment), f"{where}: {src}")
    return out.getvalue()


def assert_vmap_of_sparse_solves(solver: str, M, rng, tags=frozenset()) -> None:
    """`sd.vmap` of a sparse solver's gradient over matrices on one pattern
    and right-hand sides (`M` a sorted CSR matrix, `tags` its structure
    tags), and over right-hand sides with one shared matrix, against dense
    solves."""
    import sciad.numpy as snp

    def csr(d):
        return sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape, tags=tags)

    def loss(d, b):
        return snp.sum(sd.linalg.solve(csr(d), b, solver=solver) ** 2)

    n = M.shape[0]
    ds = np.stack([M.data * (1 + 0.1 * k) for k in range(4)])
    bs = rng.standard_normal((4, n))
    out = np.asarray(sd.function(sd.vmap(sd.grad(loss, argnums=1)))(ds, bs))
    for k in range(4):
        D = sp.csr_array(M).toarray() * (1 + 0.1 * k)
        np.testing.assert_allclose(out[k], np.linalg.solve(D.T, 2 * np.linalg.solve(D, bs[k])),
                                   rtol=1e-9)
    # a shared matrix, a batch of right-hand sides: one factorization
    x = sd.function(sd.vmap(lambda b: sd.linalg.solve(csr(M.data), b, solver=solver)))(bs)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(sp.csr_array(M).toarray(), bs.T).T,
                               rtol=1e-10)


def rss_mib() -> float:
    """The process's resident memory now (MiB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def nodes_named(graph, name: str) -> list:
    """The nodes of `graph` and of its subgraphs (at any depth) whose
    primitive is `name`."""
    found = []
    for node in graph.nodes:
        if node.primitive.name == name:
            found.append(node)
        for sub in node.subgraphs:
            found += nodes_named(sub, name)
    return found


#: the budget tests' heat equation: N points (a carry of 512 bytes), STEPS steps
BUDGET_N, BUDGET_STEPS = 64, 103


def budget_heat_loss(k, u0, checkpoints, reverse=False, steps=BUDGET_STEPS):
    """A scanned explicit heat equation with per-step inputs and outputs,
    checkpointed by `checkpoints` (the memory-budget tests' loss)."""
    import sciad.numpy as snp

    def step(u, x):
        u = u + 0.1 * k * x * (snp.roll(u, 1) + snp.roll(u, -1) - 2 * u)
        return u, snp.sum(u * k)

    u, ys = sd.scan(step, u0, xs=np.linspace(1.0, 1.5, steps), reverse=reverse,
                    checkpoints=checkpoints)
    return snp.sum(u ** 2) + snp.sum(ys ** 2) / steps


def scan_adjoint_schedule(fn, *args):
    """The schedule of the one `scan_adjoint` node of `fn`'s graph."""
    g = sd.trace(fn, *args)
    (adj,) = nodes_named(g, "scan_adjoint")
    return adj.params["schedule"]
