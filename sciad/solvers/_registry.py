"""The solver registry: a graph param names a solver, and this maps the name
to its record.

A record is one object in one file under `sciad.solvers` that says all there
is to know about a solver (what it applies to, how it factors and solves,
where it runs, how it is checked, what it costs); rules and passes look it up
by the name their node holds (so graphs still print and serialize names) and
ask it, instead of comparing names. Records come in families: `"linear"`
(`sciad.solvers._linear`), `"root"` (root methods, `sciad.solvers.nonlinear._root_methods`),
`"jacobian"` (how a root method's linear systems are solved),
`"preconditioner"` (an iterative solve's preconditioner,
`sciad.solvers.iterative._iterative.AbstractPreconditioner`), `"ode stepper"`
(`sciad.solvers.ode._ode_steppers`) and `"ode adjoint"` (an `odeint` node's
reverse mode, `sciad.primitives._ode_adjoint`).

Adding a solver is one new file and one `register(...)` line (the built-in
ones are registered in `sciad/solvers/__init__.py`).
"""

from __future__ import annotations

from ..errors import InvalidOptionError, RegistrationError

_RECORDS: dict[str, dict[str, object]] = {}


def register(record, *, family: str | None = None, name: str | None = None):
    """Registers `record` under `(record.family, record.name)` (or the
    `family` and `name` given: a record that does not carry them, as an ODE
    stepper's table entry); returns it. A name is registered once per family
    (`unregister` it first)."""
    family = record.family if family is None else family
    name = record.name if name is None else name
    table = _RECORDS.setdefault(family, {})
    old = table.get(name)
    if old is not None and old is not record:
        raise RegistrationError(f"a {family} solver {name!r} is already "
                                f"registered ({type(old).__module__}.{type(old).__name__}); "
                                "unregister it first.")
    table[name] = record
    return record


def family(name: str) -> dict:
    """The live table of the family `name` (name -> record), as the modules
    that define a family expose it (`sciad.ode.SOLVERS`: the ODE steppers)."""
    return _RECORDS.setdefault(name, {})


def unregister(name: str, family: str = "linear") -> None:
    """Removes the record `name` of `family` (a no-op if there is none)."""
    _RECORDS.get(family, {}).pop(name, None)


def records(family: str = "linear") -> tuple:
    """The records of `family`, in the order they were registered."""
    return tuple(_RECORDS.get(family, {}).values())


def names(family: str = "linear") -> tuple[str, ...]:
    """The names of `family`'s records, in the order they were registered."""
    return tuple(_RECORDS.get(family, {}))


def lookup(name, family: str = "linear", *, op: str | None = None, what: str = "solver"):
    """The record `name` of `family`; an unknown name raises
    `InvalidOptionError` listing the known ones. A record itself (one
    configured by its arguments, as `sd.linalg.AMG(near_null_space=B)`) of
    that family is its own record."""
    if isinstance(name, tuple({type(r) for r in _RECORDS.get(family, {}).values()})):
        return name
    record = _RECORDS.get(family, {}).get(name) if isinstance(name, str) else None
    if record is None:
        raise InvalidOptionError(f"unknown {what} {name!r}; choose one of "
                                 f"{', '.join(map(repr, names(family)))}.", op=op)
    return record
