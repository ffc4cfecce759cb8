"""Declared params: the names, types and defaults of a primitive's static params.

A primitive declares its params next to its definition:

```python
sparse_assemble_p = Primitive("sparse.assemble", params={
    "pattern": Pattern,                                  # required
    "index": Param((IndexMap, None), default=None),      # optional
    "tags": Param(frozenset[str], default=frozenset()),
})
```

The loader checks every node of a file against its primitive's declaration
and `verify` checks every node of a graph, so a misspelled, missing or
ill-typed param is an error that names the op and the param instead of a
node that computes something else. A primitive declared without `params=`
(a user primitive that gave none) accepts any params, as before.
"""

from __future__ import annotations

import reprlib
import types
import typing
from types import MappingProxyType
from typing import Any, Mapping
from ..errors import RegistrationError

__all__ = ["Param", "REQUIRED"]


class _Required:
    """The default of a param that has none: it must be given."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


def _spec_problem(spec) -> str | None:
    """Why `spec` is not a type spec (see `Param`), or None."""
    if spec is None or isinstance(spec, type):
        return None
    if isinstance(spec, tuple):
        if not spec:
            return "an empty tuple of alternatives admits no value"
        for s in spec:
            problem = _spec_problem(s)
            if problem:
                return problem
        return None
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if origin in (types.UnionType, typing.Union):
        return _spec_problem(args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _spec_problem(args[0])
        return _spec_problem(args) if args else None
    if origin is frozenset and len(args) == 1:
        return _spec_problem(args[0])
    return (f"{spec!r} is not a type spec: use a class, None, a tuple of "
            "alternatives, `A | B`, `tuple[T, ...]`, `tuple[T1, T2]` or `frozenset[T]`")


def _matches(value, spec) -> bool:
    if spec is None:
        return value is None
    if isinstance(spec, type):
        if spec is int and isinstance(value, bool):
            return False  # True is an int to Python, not to a declaration
        return isinstance(value, spec)
    if isinstance(spec, tuple):
        return any(_matches(value, s) for s in spec)
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if origin in (types.UnionType, typing.Union):
        return any(_matches(value, s) for s in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(_matches(v, s) for v, s in zip(value, args))
    if origin is frozenset:
        return isinstance(value, frozenset) and all(_matches(v, args[0]) for v in value)
    raise AssertionError(f"unchecked type spec {spec!r}; this is a bug in sciad")


def describe(spec) -> str:
    """The readable form of a type spec: `tuple[int, ...]`, `IndexMap | None`."""
    if spec is None or spec is type(None):
        return "None"
    if isinstance(spec, type):
        numpy = spec.__module__.split(".")[0] == "numpy"
        return f"numpy.{spec.__qualname__}" if numpy else spec.__qualname__
    if isinstance(spec, tuple):
        return " | ".join(describe(s) for s in spec)
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(describe(s) for s in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{describe(args[0])}, ...]"
        return f"tuple[{', '.join(describe(s) for s in args) or '()'}]"
    return f"frozenset[{describe(args[0])}]"


# a repr for messages: a few elements and levels of a container, so that a
# value from a file (a long list, a deeply nested one) shows in little time
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 40


def describe_value(value) -> str:
    """`float 1.5`, `tuple (0, 'a')`: a value's class and shortened repr."""
    return f"{type(value).__name__} {_SHORT_REPR.repr(value)}"


def _first_mismatch(value, spec) -> str:
    """Where in `value` the mismatch is, for tuples and frozensets: ` (element 1
    is float 1.5)`; empty when it is the value itself."""
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if origin is tuple and isinstance(value, tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            elems = [args[0]] * len(value)
        elif len(value) != len(args):
            return f" (a tuple of {len(args)}, got {len(value)} elements)"
        else:
            elems = list(args)
        for i, (v, s) in enumerate(zip(value, elems)):
            if not _matches(v, s):
                return f" (element {i} is {describe_value(v)})"
    if origin is frozenset and isinstance(value, frozenset):
        for v in value:
            if not _matches(v, args[0]):
                return f" (it holds {describe_value(v)})"
    return ""


class Param:
    """The declaration of one static param of a primitive.

    **Arguments:**

    - `type`: what a value may be. A class (matched with `isinstance`, except
        that a bool is not an `int`); `None` (the value `None`); a tuple of
        alternatives, or `A | B`; `tuple[T, ...]` (a tuple of any length whose
        elements match `T`), `tuple[T1, T2]` (fixed length), `frozenset[T]`.
        These nest: `tuple[tuple[int, int], ...]`. `object` admits anything.
    - `default`: the value a node without this param behaves as having (what
        the rules' keyword defaults say). Leave it out for a required param.

    In a `params=` mapping a bare type spec stands for `Param(spec)`, a
    required param. Code may leave a param with a default out of a node, and
    the printer leaves out a param at its default; a graph file states every
    declared param, defaults included, so that deleting one from a file is
    an error rather than a different computation.
    """

    __slots__ = ("type", "default")

    def __init__(self, type, default=REQUIRED):
        problem = _spec_problem(type)
        if problem is not None:
            raise RegistrationError(f"{problem}.", op="Param")
        self.type = type
        self.default = default
        if default is not REQUIRED and not _matches(default, type):
            raise RegistrationError(f"the default {describe_value(default)} does not "
                                    f"match the declared type {describe(type)}.", op="Param")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def accepts(self, value) -> bool:
        """Whether `value` is of the declared type."""
        return _matches(value, self.type)

    def is_default(self, value) -> bool:
        """Whether `value` is this param's default (of the same class, and equal)."""
        if self.required:
            return False
        if self.default is None:
            return value is None
        return type(value) is type(self.default) and bool(value == self.default)

    def __str__(self) -> str:
        text = describe(self.type)
        return text if self.required else f"{text} = {self.default!r}"

    def __repr__(self) -> str:
        if self.required:
            return f"Param({describe(self.type)})"
        return f"Param({describe(self.type)}, default={self.default!r})"


def as_declaration(op: str, params: Mapping[str, Any] | None) -> Mapping[str, Param] | None:
    """A `params=` mapping as `{name: Param}` (bare type specs made required)."""
    if params is None:
        return None

    if not isinstance(params, Mapping):
        raise RegistrationError(f"`params` must map param names to `Param`s or types, "
                                f"got {describe_value(params)}.", op=op)
    out: dict[str, Param] = {}
    for name, spec in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistrationError(f"a param name must be an identifier (params are "
                                    f"keyword arguments), got {name!r}.", op=op)
        try:
            out[name] = spec if isinstance(spec, Param) else Param(spec)
        except RegistrationError as e:
            raise RegistrationError(f"param `{name}`: {e.message}", op=op) from None
    return MappingProxyType(out)


def param_problem(declared: Mapping[str, Param] | None, params: Mapping[str, Any], *,
                  explicit: bool = False) -> str | None:
    """The first way `params` break a declaration, as text, or None.

    `explicit=True` (a file) also requires the params that have defaults.
    Unknown names are reported first.
    """
    if declared is None:
        return None
    for name in params:
        if name not in declared:
            known = ", ".join(f"`{k}`" for k in declared) or "none"
            return f"unknown param `{name}` (declared: {known})."
    for name, spec in declared.items():
        if name not in params:
            if spec.required:
                return f"missing param `{name}` (expected {describe(spec.type)})."
            if explicit:
                return (f"missing param `{name}` (expected {spec}); a graph file states "
                        "every declared param, defaults included.")
            continue
        value = params[name]
        if not spec.accepts(value):
            return (f"param `{name}` expects {describe(spec.type)}, got "
                    f"{describe_value(value)}{_first_mismatch(value, spec.type)}.")
    return None


def shown_params(declared: Mapping[str, Param] | None,
                 params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` without those at their declared default (what the printer shows)."""
    if not declared:
        return dict(params)
    return {k: v for k, v in params.items()
            if not (k in declared and declared[k].is_default(v))}
