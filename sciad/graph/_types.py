"""Types of graph values: frozen, hashable, printable.

`TensorType(shape, dtype, tags)` is the type of a dense array. Sparse and
factorization types subclass `AbstractType` the same way; every type knows
its short printed form (`f64[3,4]`) and its JSON form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

_SHORT = {
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "complex64": "c64",
    "complex128": "c128",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "bool",
}
_LONG = {v: k for k, v in _SHORT.items()}

#: Structure tags a matrix type may carry. Ops may rely on them; with
#: `sciad.config.enable_checks` on they are verified where they are introduced.
KNOWN_TAGS = frozenset({"symmetric", "hermitian", "spd", "lower", "upper", "diagonal"})


def dtype_short(dtype) -> str:
    """`float64` -> `f64`; the names the printer uses."""
    dtype = np.dtype(dtype)
    try:
        return _SHORT[dtype.name]
    except KeyError:
        return dtype.name


def dtype_from_short(name: str) -> np.dtype:
    return np.dtype(_LONG.get(name, name))


def canonical_dtype(dtype) -> np.dtype:
    """The dtypes sciad supports: NumPy's bool, integer, float and complex."""
    dtype = np.dtype(dtype)
    if dtype.name not in _SHORT:
        from ..errors import DTypeError

        raise DTypeError(
            f"dtype {dtype} is not supported; use one of "
            f"{', '.join(sorted(_SHORT))}."
        )
    return dtype


class AbstractType:
    """Interface of a graph value's type.

    A type is frozen and hashable, prints itself with `str_short()`, and round
    trips through `to_json()` / `type_from_json`.
    """

    __slots__ = ()

    def str_short(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def to_json(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def __str__(self) -> str:
        return self.str_short()


@dataclass(frozen=True, slots=True)
class TensorType(AbstractType):
    """A dense array of static `shape` and `dtype`.

    `tags` records structural facts about a matrix (`symmetric`, `spd`, ...);
    most ops drop them.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    tags: frozenset = field(default=frozenset())

    def __post_init__(self):
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            from ..errors import ShapeError

            raise ShapeError(f"TensorType: negative dimension in shape {shape}.")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "tags", frozenset(self.tags))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def update(self, **kw) -> "TensorType":
        return TensorType(
            kw.get("shape", self.shape), kw.get("dtype", self.dtype), kw.get("tags", frozenset())
        )

    def str_short(self) -> str:
        text = f"{dtype_short(self.dtype)}[{','.join(map(str, self.shape))}]"
        if self.tags:
            text += "{" + ",".join(sorted(self.tags)) + "}"
        return text

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": "tensor", "shape": list(self.shape),
                               "dtype": self.dtype.name}
        if self.tags:
            out["tags"] = sorted(self.tags)
        return out

    @classmethod
    def of(cls, value) -> "TensorType":
        """The type of a concrete array-like (NumPy, JAX, Python scalar)."""
        if isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic):
            value = np.asarray(value)
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        if shape is None or dtype is None:
            value = np.asarray(value)
            shape, dtype = value.shape, value.dtype
        return cls(tuple(shape), np.dtype(dtype))


_TYPE_KINDS: dict[str, Any] = {"tensor": lambda d: TensorType(
    tuple(d["shape"]), dtype_from_short(d["dtype"]), frozenset(d.get("tags", ())))}


def register_type_kind(kind: str, from_json) -> None:
    """Lets `type_from_json` decode a new kind of type (sparse, factor, ...)."""
    _TYPE_KINDS[kind] = from_json


def type_from_json(data: dict) -> AbstractType:
    from ..errors import SerializationError

    try:
        decode = _TYPE_KINDS[data["kind"]]
    except (KeyError, TypeError):
        raise SerializationError(f"unknown value type {data!r}.", op="from_json") from None
    try:
        return decode(data)
    except Exception as e:
        raise SerializationError(f"bad value type {data!r}: {e}", op="from_json") from None
