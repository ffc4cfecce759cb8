"""The exceptions sciad raises.

Every user-facing error is a subclass of `SciadError` that also inherits the
matching builtin (`ShapeError` is a `ValueError`, `DTypeError` a `TypeError`, ...),
so `except ValueError` keeps working. Each message names the operation, what
was expected, what was received, and the user's source line.
"""

from __future__ import annotations

import functools
import json
from typing import NoReturn

import numpy as np

__all__ = [
    "SciadError",
    "ArpackNoConvergenceError",
    "ShapeError",
    "InvalidOptionError",
    "DTypeError",
    "MissingCoefficientError",
    "IndexingError",
    "TracerError",
    "VerificationError",
    "SerializationError",
    "ResourceLimitError",
    "LoweringError",
    "RegistrationError",
    "MissingRuleError",
    "NotSupportedError",
    "RuleError",
    "SingularMatrixError",
    "NotPositiveDefiniteError",
    "StructureError",
    "DegenerateEigenvalueError",
    "NonFiniteError",
    "ZeroSumError",
    "ConvergenceError",
    "SciadWarning",
    "unwrapped",
    "plain",
    "IllConditionedWarning",
    "SparsityWarning",
    "BatchFallbackWarning",
]


def plain(x) -> str:
    """`repr(x)` with NumPy scalars and arrays shown as Python numbers and
    lists, for messages: `10.0`, not `np.float64(10.0)`."""
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
        return repr(x.tolist())
    return repr(x)


class SciadError(Exception):
    """Base class of every error sciad raises on purpose.

    `op` is the operation that complained (a primitive name or a public
    function), `source` the user's `file:line` when it is known.
    """

    def __init__(self, message: str, *, op: str | None = None, source=None):
        self.op = op
        self.source = source
        self.message = message
        super().__init__(self._format())

    def _format(self) -> str:
        text = self.message
        if self.op and not text.startswith(f"{self.op}:"):
            text = f"{self.op}: {text}"
        if self.source is not None:
            text = f"{text}\n  at {self.source}"
        return text

    def with_source(self, source) -> "SciadError":
        """Attaches `source` if none is set yet; returns `self` for `raise`."""
        if self.source is None and source is not None:
            self.source = source
            self.args = (self._format(),)
        return self

    def __str__(self) -> str:
        return self._format()


class ShapeError(SciadError, ValueError):
    """Shapes that do not fit an operation, found at trace time."""


class InvalidOptionError(SciadError, ValueError):
    """An argument's value an operation does not accept, found before it runs:
    an unknown option (a solver's or a method's name), a tolerance or a step
    count out of range, output times that do not increase. Shapes that do
    not fit are `ShapeError`s."""


class MissingCoefficientError(SciadError, AttributeError):
    """A finite-element form read a coefficient `w.<name>` that
    `sd.fem.assemble` was not given (an `AttributeError`, as scikit-fem's
    own, so that `hasattr(w, name)` in a form still works)."""


class DTypeError(SciadError, TypeError):
    """A dtype an operation does not accept, found at trace time."""


class IndexingError(SciadError, IndexError):
    """A static index out of range or of an unsupported kind."""


class TracerError(SciadError, TypeError):
    """A traced value used where a concrete Python value is needed
    (`bool(x)`, `int(x)`, `np.asarray(x)`), or used after its trace ended."""


class VerificationError(SciadError, ValueError):
    """A malformed graph: a value used before it is defined, defined twice,
    or a type that disagrees with the op's shape rule."""


class SerializationError(SciadError, ValueError):
    """JSON that does not describe a valid graph, or names an unknown op."""


class ResourceLimitError(SerializationError):
    """A graph file over one of the loader's limits (its nodes, the elements
    of its arrays, how deeply it nests), found before the loader allocates
    what the file asks for. The message names the limit and where in the
    file it was exceeded; `Graph.from_json` takes larger limits for a file
    you trust."""


class LoweringError(SciadError, RuntimeError):
    """An op's JAX implementation failed while the graph was lowered."""


class RegistrationError(SciadError, ValueError):
    """A primitive registered twice, or a rule defined twice."""


class MissingRuleError(SciadError, NotImplementedError):
    """An op lacks the rule a transform needs (e.g. no `impl` to lower)."""


class NotSupportedError(SciadError, NotImplementedError):
    """A valid request that sciad does not support (yet); the message says
    what to use instead."""


class RuleError(SciadError, ValueError):
    """A derivative rule that is malformed (wrong tangent type, wrong number of
    cotangents) or wrong (`sciad.testing.check_rules` found it disagreeing
    with finite differences or with the other rule)."""


class SingularMatrixError(SciadError, ValueError):
    """A linear solve whose matrix is singular: structurally (an empty row or
    column, found at trace time) or numerically (a zero pivot, found when it
    runs)."""


class NotPositiveDefiniteError(SciadError, ValueError):
    """A matrix assumed (or tagged) symmetric positive definite whose Cholesky
    factorization broke down."""


class DegenerateEigenvalueError(SciadError, ValueError):
    """A derivative through an eigendecomposition that depends on the choice
    of eigenvectors inside a cluster of (numerically) repeated eigenvalues,
    or on the order of the eigenvalues inside one, where it is not defined.
    Functions of whole clusters (their eigenvalue sums, spectral projectors)
    differentiate fine."""


class StructureError(SciadError, ValueError):
    """A matrix whose structure a solver cannot take (a preconditioner that
    smooths with the diagonal, given a pattern without every diagonal
    entry), or that contradicts a structure tag it carries (`symmetric`,
    `spd`): its pattern, at trace time, or its values, by the checks
    `sciad.config.enable_checks` turns on."""


class NonFiniteError(SciadError, FloatingPointError):
    """NaN or infinity in the input of an operation that cannot use it (a
    matrix or right-hand side of a solve)."""


class ZeroSumError(SciadError, ZeroDivisionError):
    """Weights that sum to zero where an operation divides by their sum
    (`sciad.numpy.average`, as NumPy's `ZeroDivisionError`)."""


class ConvergenceError(SciadError, RuntimeError):
    """An iterative solver that did not reach its tolerance. `residual`,
    `tolerance` and `iterations` say how far it got; a root solve also
    gives `atol` (the residual test's bound) and `error` (the last step's
    estimated error in `x` relative to `||x||_inf`, which `tolerance`
    bounds)."""

    def __init__(self, message: str, *, op: str | None = None, source=None,
                 residual: float | None = None, tolerance: float | None = None,
                 iterations: int | None = None, atol: float | None = None,
                 error: float | None = None):
        self.residual = residual
        self.tolerance = tolerance
        self.iterations = iterations
        self.atol = atol
        self.error = error
        super().__init__(message, op=op, source=source)


class ArpackNoConvergenceError(ConvergenceError):
    """ARPACK's non-convergence in `sciad.linalg.eigsh`, as SciPy's
    `ArpackNoConvergence`: `eigenvalues` and `eigenvectors` (columns) are the
    pairs that did converge (`eigenvectors` None where too large to carry),
    `converged` their number."""

    def __init__(self, message: str, *, op: str | None = None, source=None,
                 residual: float | None = None, tolerance: float | None = None,
                 iterations: int | None = None, converged: int = 0, eigenvalues=(),
                 eigenvectors=None):
        self.converged = converged
        self.eigenvalues = np.asarray(eigenvalues, dtype=np.float64)
        v = None if eigenvectors is None else np.asarray(eigenvectors, dtype=np.float64)
        if v is not None and v.ndim != 2:
            v = v.reshape(-1, max(len(self.eigenvalues), 1))[:, :len(self.eigenvalues)]
        self.eigenvectors = v
        super().__init__(message, op=op, source=source, residual=residual,
                         tolerance=tolerance, iterations=iterations)


class StorageError(SciadError, OSError):
    """The disk level of a memory budget (`sd.MemoryBudget(disk=...)`) could
    not write or read a loop's stored carries (a full disk, a directory
    removed or made read-only while the program ran)."""


class SciadWarning(UserWarning):
    """Base class of the warnings sciad issues."""


class BatchFallbackWarning(SciadWarning):
    """`sd.vmap` met a primitive without a batch rule and maps it over the
    batch as one `map` node (`jax.vmap` of its implementation). Shown once
    per primitive."""


class SparsityWarning(SciadWarning):
    """A Jacobian-sparsity interpretation met a primitive without a sparsity
    rule and took its outputs to depend on every element of its operands
    (sound, but the pattern may be denser than it is)."""


class ConstantsWarning(SciadWarning):
    """A large index array (a sparse pattern's, a mesh's) enters a program as
    a constant copied into its text, which XLA folds when it compiles (so
    compilation grows with the mesh), because JAX was imported before sciad
    and JAX's hoisting of large constants is off. Import sciad before JAX,
    or set `JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1` in the environment (see
    `sciad.config`, "Large constants"). Shown once per process."""


class IllConditionedWarning(SciadWarning):
    """A linear system whose condition number exceeds `1/eps` of its dtype:
    the solution satisfies a nearby system (its residual is small) but may
    have no correct digits. The message gives the condition estimate; see
    `sd.linalg.cond` and `solve(..., throw=False)`'s `SolveInfo.rcond`."""


# Errors found while a compiled program runs travel out of XLA as text (JAX
# re-raises them as `JaxRuntimeError`); `sd.function` turns text carrying this
# marker back into the sciad error it names.
RUNTIME_MARKER = "[sciad-runtime-error]"
RUNTIME_END = "[/sciad-runtime-error]"


def runtime_error_text(cls: type, message: str, *, op=None, source=None, **extra) -> str:
    """The text a run-time check raises for `cls(message, op=..., **extra)`."""
    doc = {"kind": cls.__name__, "op": op, "source": None if source is None else str(source),
           "message": message, "extra": extra}
    return f"{RUNTIME_MARKER}{json.dumps(doc)}{RUNTIME_END}"


# Errors a compiled kernel (an XLA FFI handler sciad calls) raises with its own
# text, which sciad cannot mark: a fragment of that text -> (class, op, message).
_KERNEL_ERRORS: dict[str, tuple[type, str | None, str]] = {}


def register_kernel_error(fragment: str, cls: type, message: str, *, op=None) -> None:
    """Makes a JAX runtime error whose text holds `fragment` (a compiled
    kernel's own failure) re-raise as `cls(message, op=op)` (the kernel's
    text is appended), as the marked ones do."""
    _KERNEL_ERRORS[fragment] = (cls, op, message)


def runtime_error_from(err: BaseException) -> SciadError | None:
    """The sciad error carried in a JAX runtime error's text, if any."""
    text = str(err)
    i = text.find(RUNTIME_MARKER)
    j = text.find(RUNTIME_END, i)
    if i < 0 or j < 0:
        for fragment, (cls, op, message) in _KERNEL_ERRORS.items():
            if fragment in text:
                line = next(t for t in text.splitlines() if fragment in t).strip()
                return cls(f"{message} (the kernel said: {line})", op=op)
        return None
    try:
        doc = json.loads(text[i + len(RUNTIME_MARKER):j])
        cls = globals()[doc["kind"]]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, SciadError)):
        return None
    extra = doc.get("extra", {})
    try:
        err = cls(doc["message"], op=doc.get("op"), source=doc.get("source"), **extra)
    except TypeError:  # a class without those keywords: keep them as attributes
        err = cls(doc["message"], op=doc.get("op"), source=doc.get("source"))
        for k, v in extra.items():
            setattr(err, k, v)
    return err


def reraise(err: BaseException) -> NoReturn:
    """Raises `err` as the sciad error it carries (a run-time check's error
    leaving XLA as JAX's runtime error, or a host function's), or as it is."""
    sciad_err = runtime_error_from(err)
    if sciad_err is None:
        raise err
    forget_failed_runs()
    raise sciad_err from None


def forget_failed_runs() -> None:
    """Drops JAX's record of the failed programs whose error was raised.

    JAX keeps, per device, a token of the last program it ran with host
    callbacks (sciad's checks), to wait for in `jax.effects_barrier()`; a
    program whose check failed leaves a token that holds its error, so a
    later `jax.effects_barrier()`, and JAX's own at interpreter exit, raised
    that error again ("Exception ignored in atexit callback") after sciad
    had raised it. Called where a run-time check's error is raised: waits
    for each device's last program and forgets the tokens that failed.
    (JAX's private state; nothing where it has another shape.)"""
    try:
        from jax._src import dispatch
        tokens = dispatch.runtime_tokens.output_runtime_tokens
    except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX version
        return
    for device, token in list(tokens.items()):
        try:
            token.block_until_ready()
        except Exception:  # (a failed program's: its error is the one raised)
            if tokens.get(device) is token:
                del tokens[device]


class unwrapped:
    """A context (and decorator) turning JAX's runtime error that carries a
    sciad error into that sciad error.

    `sd.function`, eager calls and `sd.to_jax` functions called directly do
    this themselves. A program you compile yourself (`jax.jit` of code that
    calls an `sd.to_jax` function) runs under JAX's own dispatch, so a
    failed check (a singular matrix, say) reaches you as
    `jax.errors.JaxRuntimeError` with sciad's message in its text:

    ```python
    with sd.errors.unwrapped():
        x = jax.jit(step)(params)      # raises SingularMatrixError, not JaxRuntimeError
        x.block_until_ready()          # (JAX dispatches asynchronously)
    ```
    """

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if value is None or isinstance(value, SciadError):
            return False
        err = runtime_error_from(value)
        if err is None:
            return False
        forget_failed_runs()
        raise err from None

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapper
