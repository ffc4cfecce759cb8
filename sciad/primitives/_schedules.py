"""Checkpoint schedules: which carries a loop's reverse pass stores.

A loop's `checkpoints` param is None (store every step's residuals) or one
of these: `Binomial(s)` (revolve: at most `s` stored carries, the fewest
recomputed steps), `EveryK(k)` (a carry every `k` steps) and, for ODE
solves, `Segments(s)`. A `MemoryBudget` given to a loop becomes one of them
when the loop is traced (`MemoryBudget.schedule`): the carry's size is known
then. A schedule gives its actions (`actions(length)`),
which `checkpoint_runs` compiles into runs of plain loops (`_replay`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .. import _cache
from ..errors import InvalidOptionError, ShapeError, plain
from ..graph._serialize import register_param_type
from ._replay import Runs, compile_runs



# ---------------------------------------------------------------------------
# checkpoint schedules


@dataclass(frozen=True)
class Binomial:
    """Binomial checkpointing (revolve): reverse mode stores at most
    `snapshots` carries and recomputes the forward steps between them, the
    fewest recomputations any schedule with that many snapshots needs
    (Griewank and Walther). The gradient is the same as storing every step.
    `sd.scan(..., checkpoints=s)` with an int `s` means `Binomial(s)`.
    `budget`: the bytes of the `MemoryBudget` it was chosen for, if any
    (shown by `sd.cost`)."""

    snapshots: int
    budget: int | None = None

    def __post_init__(self):
        if not isinstance(self.snapshots, int) or isinstance(self.snapshots, bool) \
                or self.snapshots < 1:
            raise InvalidOptionError(f"a binomial schedule needs snapshots >= 1 (an int), got "
                                     f"{plain(self.snapshots)}.", op="scan")

    def __str__(self) -> str:
        if self.budget is None:
            return f"binomial({self.snapshots})"
        return f"binomial({self.snapshots}) for a {_cache.si(self.budget)} budget"

    def slots(self, length: int) -> int:
        """The carries stored at most, for `length` steps."""
        return min(self.snapshots, max(length, 1))

    def actions(self, length: int) -> np.ndarray:
        """The schedule as `scan_adjoint`'s action rows (`revolve_actions`)."""
        return revolve_actions(length, self.slots(length))


@dataclass(frozen=True)
class EveryK:
    """Periodic checkpointing: reverse mode runs forward from the start,
    storing every `k`-th carry, then re-runs each segment of `k` steps once
    from its stored start, keeping the segment's carries for the backward
    parts. At most `ceil(length / k) + k - 2` stored carries (about
    `2 sqrt(length)` for `k` near `sqrt(length)`) and fewer than `2 length`
    recomputed steps, whatever `k`. For the same number of stored carries a
    `Binomial` schedule never recomputes more (revolve is optimal); this is
    the simple policy many simulation codes use, to compare against. The
    gradient is the same as storing every step."""

    k: int

    def __post_init__(self):
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ShapeError(f"an every-k schedule needs k >= 1 (an int), got {self.k!r}.",
                             op="scan")

    def __str__(self) -> str:
        return f"every_k({self.k})"

    def slots(self, length: int) -> int:
        k = min(self.k, max(length, 1))
        return max(-(-length // k) + max(k - 2, 0), 1)

    def actions(self, length: int) -> np.ndarray:
        # rows as in `revolve_actions`: 0 store in slot a, 1 advance a -> b,
        # 2 load slot a, 3 backward part of step a
        k = min(self.k, max(length, 1))
        starts = list(range(0, length, k))
        rows: list[tuple[int, int, int]] = []
        for j, s0 in enumerate(starts):
            rows.append((0, j, 0))
            if j + 1 < len(starts):
                rows.append((1, s0, s0 + k))
        m = len(starts)

        def slot(j, t):  # the slot of the carry at step t of segment j
            s0 = starts[j]
            return j if t == s0 else m + t - s0 - 1

        for j in reversed(range(m)):
            s0, e = starts[j], min(starts[j] + k, length)
            if j + 1 < m:
                rows.append((2, j, 0))
            for t in range(s0, e - 1):  # the segment's carries, but the last
                if t > s0:  # (its first is in slot j)
                    rows.append((0, slot(j, t), 0))
                rows.append((1, t, t + 1))
            rows.append((3, e - 1, 0))
            for t in reversed(range(s0, e - 1)):
                rows.append((2, slot(j, t), 0))
                rows.append((3, t, 0))
        return np.asarray(rows, np.int32).reshape(-1, 3)


def advanced(schedule, length: int) -> int:
    """The forward steps a RAM schedule's actions advance over on `length`
    steps (the backward pass recomputes them all where it starts from the
    initial carry)."""
    actions = schedule.actions(length)
    advances = actions[actions[:, 0] == 1]
    return int(np.sum(advances[:, 2] - advances[:, 1])) if len(advances) else 0


def ram_recomputed(schedule: "Binomial", length: int) -> int:
    """The forward steps reverse mode through a loop recomputes on a RAM
    schedule (the forward pass makes the first run's stores)."""
    runs = checkpoint_runs(schedule, length)
    return advanced(schedule, length) - (int(runs.runs[0, 2]) if len(runs.runs) else 0)


@dataclass(frozen=True)
class TwoLevel:
    """Two-level checkpointing: reverse mode runs the loop forward once,
    keeping the carry at the start of each `segment` steps in a second
    level of memory; then, segment by segment from the last, takes its
    first carry back and runs the segment's backward pass on
    `Binomial(snapshots)` in RAM. With `segment = snapshots + 1` each step
    of a segment is recomputed once there. The gradient is the same, bit
    for bit, as with the carries in RAM. The second level is one of:

    - `directory`: an unnamed file in that directory (what a
      `MemoryBudget` with `disk=` becomes where the steps it spares take
      longer than the carries' trips to disk, `disk_pays`), written
      asynchronously while the loop runs on and read back one segment
      ahead; each run writes to a file of its own (see `MemoryBudget`);
    - `host=True`: the accelerator's pinned host memory (what a
      `MemoryBudget` with `host=` becomes on a GPU): the carries are one
      array of the program in JAX's `pinned_host` memory space, which XLA
      copies to and from the device. On the CPU, whose memory is the
      host's, they stay where the program's other values are.

    `budget`: the RAM budget's bytes, if it was chosen for one.

    ```python
    # 2,000 steps: a carry on disk every 9 steps, 8 snapshots in RAM
    u, _ = sd.scan(step, u0, length=2000,
                   checkpoints=sd.TwoLevel(segment=9, snapshots=8, directory="/scratch"))
    # the same with the carries in the GPU's pinned host memory
    u, _ = sd.scan(step, u0, length=2000,
                   checkpoints=sd.TwoLevel(segment=9, snapshots=8, host=True))
    ```
    """

    segment: int
    snapshots: int
    directory: str | None = None
    budget: int | None = None
    host: bool = False

    def __post_init__(self):
        for name in ("segment", "snapshots"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidOptionError(f"a two-level schedule needs {name} >= 1 (an int), "
                                         f"got {plain(v)}.", op="scan")
        if not isinstance(self.host, bool):
            raise InvalidOptionError(f"a two-level schedule's `host` is True or False, got "
                                     f"{plain(self.host)}.", op="scan")
        if (self.directory is None) == (not self.host):
            raise InvalidOptionError(
                "a two-level schedule needs one second level: `directory` (a directory "
                "where its carries go on disk) or `host=True` (pinned host memory), got "
                + ("both." if self.host else "neither."), op="scan")
        if self.directory is not None:
            object.__setattr__(self, "directory", _directory(self.directory))

    def __str__(self) -> str:
        ram = "" if self.budget is None else f" for a {_cache.si(self.budget)} budget"
        return (f"two levels{ram}: a carry {self.where} every {self.segment} steps, "
                f"binomial({self.snapshots}) in RAM within each")

    @property
    def where(self) -> str:
        """Where the second level's carries are: "in host memory" or "on
        disk" (as `sd.cost` says)."""
        return "in host memory" if self.host else "on disk"

    def inner(self) -> Binomial:
        """The RAM schedule of one segment."""
        return Binomial(self.snapshots)

    def segments(self, length: int) -> tuple[int, int]:
        """`(m, last)`: the segments of a loop of `length >= 1` steps and the
        last one's steps (the others have `segment`); `m - 1` carries go to
        the second level."""
        m = max(-(-length // self.segment), 1)
        return m, length - (m - 1) * self.segment

    def recomputed(self, length: int) -> int:
        """The forward steps reverse mode recomputes: the sweep keeping the
        second level's carries, and each segment's RAM schedule."""
        if length == 0:
            return 0
        m, last = self.segments(length)
        return ((m - 1) * (self.segment + advanced(self.inner(), self.segment))
                + advanced(self.inner(), last))


#: The time model that decides whether carries go to disk where that
#: recomputes fewer steps: a step takes `STEP_SECONDS`, plus its carry's
#: bytes moved three times at `MEMORY_BYTES_PER_S`, plus its FLOPs at
#: `FLOPS_PER_S`; a carry on disk takes two host calls (its write and its
#: read) and its bytes copied twice at `COPY_BYTES_PER_S`. Measured here: a
#: host call about 30 us, a 200-point heat step about 0.5 us, a
#: 100,000-point one about 0.3 ms (so a 1.6 KB carry on disk costs more
#: than the ~30 steps it spares, a 0.8 MB one far less).
STEP_SECONDS, MEMORY_BYTES_PER_S, FLOPS_PER_S = 0.2e-6, 1e10, 1e9
HOST_CALL_SECONDS, COPY_BYTES_PER_S = 35e-6, 4e9


def disk_pays(saved_steps: int, disk_carries: int, carry_bytes: int,
              step_flops: float) -> bool:
    """Whether sparing `saved_steps` recomputed steps is worth writing and
    reading `disk_carries` carries of `carry_bytes` (the time model above)."""
    step = (STEP_SECONDS + 3 * carry_bytes / MEMORY_BYTES_PER_S
            + float(step_flops) / FLOPS_PER_S)
    carry = 2 * HOST_CALL_SECONDS + 2 * carry_bytes / COPY_BYTES_PER_S
    return saved_steps * step > disk_carries * carry


#: The time model of the host level (a GPU's pinned host memory), which
#: decides whether carries go there where that recomputes fewer steps: a
#: step on the device takes `DEVICE_STEP_SECONDS` (a loop iteration's
#: kernels and its predicate's trip to the host, which XLA's GPU loops make),
#: plus its carry's bytes moved three times at `DEVICE_BYTES_PER_S`, plus
#: its FLOPs at `DEVICE_FLOPS_PER_S`; a carry in host memory takes two
#: copies over the link (out and back), each `HOST_COPY_SECONDS` plus its
#: bytes at `HOST_LINK_BYTES_PER_S`.
DEVICE_STEP_SECONDS, DEVICE_BYTES_PER_S, DEVICE_FLOPS_PER_S = 20e-6, 3e12, 2e13
HOST_COPY_SECONDS, HOST_LINK_BYTES_PER_S = 10e-6, 4e10


def host_pays(saved_steps: int, host_carries: int, carry_bytes: int,
              step_flops: float) -> bool:
    """Whether sparing `saved_steps` recomputed steps on the device is worth
    copying `host_carries` carries of `carry_bytes` to host memory and back
    (the time model above)."""
    step = (DEVICE_STEP_SECONDS + 3 * carry_bytes / DEVICE_BYTES_PER_S
            + float(step_flops) / DEVICE_FLOPS_PER_S)
    carry = 2 * (HOST_COPY_SECONDS + carry_bytes / HOST_LINK_BYTES_PER_S)
    return saved_steps * step > host_carries * carry


def accelerator() -> bool:
    """Whether programs run on an accelerator (JAX's default backend is not
    the CPU): only there is a `MemoryBudget`'s `host=` a level of its own."""
    import jax

    return jax.default_backend() != "cpu"


#: the fewest carries reverse mode through a checkpointed loop holds: one
#: stored, the one a backward step works on, and a scratch one
MIN_CARRIES = 3

#: the carries a two-level schedule holds besides its RAM snapshots: two
#: working cells, the write in flight and the carry read ahead
TWO_LEVEL_EXTRA = 4


class MemoryBudget:
    """How much memory reverse mode through a loop may use for the carries it
    stores: `checkpoints=sd.MemoryBudget(ram="64MiB")` on `sd.scan`,
    `sd.fori_loop`, `sd.while_loop` (with `max_steps`) and `sd.ode.odeint`
    / `solve_ivp` (its states: see `odeint`'s `checkpoints`). When the loop is
    traced, the budget becomes the schedule that recomputes the fewest
    steps with the carries that fit: `Binomial(s)` whose `s` snapshots and
    two working carries fit (`s` at most the number of steps: then each
    step is recomputed once, for its residuals); for a `while_loop`, its
    `Segments` schedule where the `s + ceil(max_steps / s) + 1` carries it
    holds fit (every step recomputed at most twice), else `Binomial`. Where
    the step holds loops of its own (a nested scan, an ODE), the carries
    are counted beside what one step's reverse pass holds (the peak of the
    step's gradient program, `inner_needs`). A budget that holds fewer than
    three carries is refused when the loop is traced, saying the minimum.
    The gradient is the same whatever the budget.

    With `disk=` (a directory; `True` for the system's temporary one), a
    `scan` or `fori_loop` whose carries do not all fit in `ram` may keep
    some on disk, where that recomputes fewer steps than RAM alone (a
    `TwoLevel` schedule): a carry every `s + 1` steps goes to disk, written
    while the loop runs on and read back ahead of the backward pass, and
    each stretch between two of them runs on `s` snapshots in RAM (`s + 4`
    carries fit in `ram`: two working, one being written, one read ahead).
    A `while_loop` whose `Segments` snapshots do not fit keeps them on disk
    instead (`Segments(s, directory)`: a segment's carries, one working and
    two in flight in `ram`; every step still recomputed at most twice).
    Each call writes to a file of its own that has no name (nothing is left
    in the directory, even when the process is killed), closed when the
    gradient returns or a check in the loop fails. The gradient is the same
    bit for bit. So does `odeint`'s checkpointed adjoint (a Runge-Kutta
    method's replay, whose intervals are while loops).

    With `host=` (bytes), where the program runs on an accelerator (a GPU),
    a `scan` or `fori_loop` whose carries do not all fit in `ram` may keep
    the carries at its segments' starts in the accelerator's pinned host
    memory instead (a `TwoLevel` schedule with `host=True`: at most `host`
    bytes of them, segments as short as that allows), where that
    recomputes fewer steps and the steps it spares take longer than the
    carries' copies to the host and back (`host_pays`). It comes before
    `disk=`, which is faster to reach only on a machine without an
    accelerator. On the CPU the host's memory is the program's own, and
    `host=` is not used (nothing there is a level apart from `ram`). A
    `while_loop`'s and `odeint`'s second level is the disk alone (their
    `host=` is not used yet).

    `sd.cost` shows the schedule chosen, the forward steps it recomputes and
    the predicted peak (the stored carries and one step's own values,
    which the budget does not include).

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    def loss(u0):
        def step(u, _):
            return u + 0.1 * (snp.roll(u, 1) - u), None
        u, _ = sd.scan(step, u0, length=100, checkpoints=sd.MemoryBudget(ram="40KiB"))
        return snp.sum(u ** 2)

    g = sd.grad(loss)(np.ones(1000))  # carries of 8 kB: 3 stored, 2 to work in
    report = sd.cost(sd.grad(loss), np.ones(1000))
    [row.note for row in report.rows if "budget" in row.note]
    # ['100 steps, binomial(3) for a 40.0 KiB budget: 391 forward steps recomputed']
    ```

    **Arguments:**

    - `ram`: bytes, an int or a string such as `"64MiB"`, `"2GB"`, `"1e9"`.
    - `disk`: None (RAM only), a directory (a `str` or path) where carries
      may go, or `True` for the system's temporary directory
      (`tempfile.gettempdir()`). It must exist and be writable.
    - `host`: None, or the bytes of an accelerator's pinned host memory
      the carries may take (an int or a string, as `ram`).
    """

    __slots__ = ("ram", "disk", "host")

    def __init__(self, ram, disk=None, host=None):
        object.__setattr__(self, "ram", _bytes(ram, "ram"))
        object.__setattr__(self, "disk", _directory(disk))
        object.__setattr__(self, "host", None if host is None else _bytes(host, "host"))

    def __setattr__(self, name, value):
        raise AttributeError("a MemoryBudget is immutable")

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryBudget) and (
            (other.ram, other.disk, other.host) == (self.ram, self.disk, self.host))

    def __hash__(self) -> int:
        return hash((MemoryBudget, self.ram, self.disk, self.host))

    def __repr__(self) -> str:
        disk = "" if self.disk is None else f", disk={self.disk!r}"
        host = "" if self.host is None else f", host={_cache.si(self.host)!r}"
        return f"MemoryBudget(ram={_cache.si(self.ram)!r}{disk}{host})"

    def carries(self, carry_bytes: int, op: str, least: int = MIN_CARRIES,
                inner: int = 0) -> int:
        """How many carries of `carry_bytes` fit beside `inner` bytes (what
        a step's own reverse pass holds: a nested loop's, `inner_needs`);
        refuses a budget that holds fewer than `least`."""
        n = max(self.ram - int(inner), 0) // max(int(carry_bytes), 1)
        if n < least:
            need = least * int(carry_bytes) + int(inner)
            beside = (f" beside the {_cache.si(int(inner))} a step's own reverse pass holds "
                      "(the loops in its body)") if inner else ""
            raise InvalidOptionError(
                f"a memory budget of {_cache.si(self.ram)} holds {n} carr"
                f"{'y' if n == 1 else 'ies'} of this loop ({_cache.si(int(carry_bytes))} "
                f"each){beside}; reverse mode needs at least {least} (one stored, one it "
                f"works in, one it recomputes into). Give at least ram={need} "
                f"({_cache.si(need)}): each backward step then recomputes the loop from its "
                "start; a few times more recomputes far less.", op=op)
        return int(n)

    def schedule(self, carry_bytes: int, length: int, op: str,
                 inner: int = 0, disk: bool = False, step_flops: float = 0.0):
        """The binomial schedule of a loop of `length` steps whose carry is
        `carry_bytes`, with the most snapshots whose cells fit beside
        `inner` bytes (`carries`): `s` stored carries take `s + 2` (the
        carry worked on, and one to recompute into). With `disk` (a loop
        that can use a second level) and a budget that names one: the
        `TwoLevel` schedule instead, in host memory on an accelerator
        (`host=`) or on disk (`disk=`), where the steps it spares take
        longer than its carries' trips there (`host_pays`, `disk_pays`,
        with the step's `step_flops`)."""
        n = self.carries(carry_bytes, op, inner=inner)
        ram = Binomial(max(1, min(n - 2, length)), budget=self.ram)
        if not disk or (self.host is None and self.disk is None) or n - 2 >= length \
                or n < TWO_LEVEL_EXTRA + 1:
            return ram
        s = n - TWO_LEVEL_EXTRA
        ram_steps = ram_recomputed(ram, length)
        if self.host is not None and accelerator():
            fit = self.host // max(int(carry_bytes), 1)  # carries in host memory
            if fit >= 1:
                two = TwoLevel(max(s + 1, -(-length // (fit + 1))), s, host=True,
                               budget=self.ram)
                saved = ram_steps - two.recomputed(length)
                if saved > 0 and host_pays(saved, two.segments(length)[0] - 1, carry_bytes,
                                           step_flops):
                    return two
        if self.disk is None:
            return ram
        two = TwoLevel(s + 1, s, self.disk, budget=self.ram)
        saved = ram_steps - two.recomputed(length)
        pays = disk_pays(saved, two.segments(length)[0] - 1, carry_bytes, step_flops)
        return two if pays else ram


def _bytes(value, name: str) -> int:
    """A budget's `name` (`ram`, `host`) as bytes, at least 1."""
    try:
        n = _cache.parse_bytes(value)
    except (ValueError, TypeError) as e:
        raise InvalidOptionError(f"`{name}` must be a number of bytes (an int, or a string "
                                 f"such as \"64MiB\"), got {plain(value)}: {e}.",
                                 op="MemoryBudget") from None
    if n < 1:
        raise InvalidOptionError(f"`{name}` must be at least 1 byte, got {plain(value)}.",
                                 op="MemoryBudget")
    return n


def _directory(disk):
    """`disk` as an absolute directory path (or None), checked."""
    import os
    import tempfile

    if disk is None or disk is False:
        return None
    if disk is True:
        disk = tempfile.gettempdir()
    try:
        path = os.path.abspath(os.fspath(disk))
    except TypeError:
        raise InvalidOptionError(f"`disk` must be a directory (a str or path), True or None, "
                                 f"got {plain(disk)}.", op="MemoryBudget") from None
    if not os.path.isdir(path):
        raise InvalidOptionError(f"`disk` must name an existing directory, got {path!r}; "
                                 "create it first.", op="MemoryBudget")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidOptionError(f"`disk` directory {path!r} is not writable by this "
                                 "process; give another.", op="MemoryBudget")
    return path


#: the loops whose reverse pass holds stored values of its own (a body that
#: holds one: its bytes count against an enclosing loop's budget)
_LOOPS = frozenset({"scan", "while", "ode.odeint"})


def _holds_loop(graph) -> bool:
    return any(node.primitive.name in _LOOPS or any(_holds_loop(g) for g in node.subgraphs)
               for node in graph.nodes)


def inner_needs(body) -> int:
    """The bytes one step's own reverse pass holds where a loop's `body`
    holds loops (a nested loop's stored carries, an ODE's recorded states):
    the peak of the body's gradient program, which an enclosing loop's
    `MemoryBudget` leaves to it; 0 for a body without loops (a step's own
    values are not counted against the budget)."""
    if not _holds_loop(body):
        return 0
    from ..graph._cost import gradient_program, graph_cost

    grad = gradient_program(body)
    return 0 if grad is None else int(graph_cost(grad).peak)


@dataclass(frozen=True)
class Segments:
    """Two-level checkpointing of a `while` loop over the steps it ran (a
    number known only when it runs): reverse mode re-runs the loop storing
    `snapshots` carries evenly spaced over those steps, then re-runs each
    segment once from its stored start, keeping the segment's carries for the
    backward parts. At most `snapshots + ceil(max_steps / snapshots)` stored
    carries, every step recomputed at most twice, and a cost that grows with
    the steps run, not with `max_steps`. A `while` loop's default (with about
    `sqrt(max_steps)` snapshots). With `directory` (what a `MemoryBudget`
    with `disk=` gives a `while_loop` whose snapshots do not fit in RAM),
    the snapshots are written to a file in it, as `TwoLevel`'s, and only a
    segment's carries are held in RAM.

    ```python
    _, u = sd.while_loop(cond, body, (0, u0), max_steps=10_000,
                         checkpoints=sd.Segments(100, directory="/scratch"))
    ```
    """

    snapshots: int
    directory: str | None = None

    def __post_init__(self):
        if not isinstance(self.snapshots, int) or isinstance(self.snapshots, bool) \
                or self.snapshots < 1:
            raise InvalidOptionError(f"a segments schedule needs snapshots >= 1 (an int), got "
                                     f"{plain(self.snapshots)}.", op="while")
        if self.directory is not None:
            object.__setattr__(self, "directory", _directory(self.directory))

    def __str__(self) -> str:
        return f"segments({self.snapshots})" + (" on disk" if self.directory else "")


register_param_type(Binomial, "binomial",
                    lambda b: b.snapshots if b.budget is None else [b.snapshots, b.budget],
                    lambda s: Binomial(int(s)) if isinstance(s, int)
                    else Binomial(int(s[0]), budget=int(s[1])))
register_param_type(Segments, "segments",
                    lambda b: b.snapshots if b.directory is None else [b.snapshots, b.directory],
                    lambda s: Segments(int(s)) if isinstance(s, int)
                    else Segments(int(s[0]), str(s[1])))
register_param_type(EveryK, "every_k", lambda b: b.k, lambda k: EveryK(int(k)))
register_param_type(TwoLevel, "two_level",
                    lambda b: [b.segment, b.snapshots, b.directory, b.budget]
                    + ([True] if b.host else []),
                    lambda s: TwoLevel(int(s[0]), int(s[1]),
                                       None if s[2] is None else str(s[2]),
                                       None if s[3] is None else int(s[3]),
                                       host=len(s) > 4 and bool(s[4])))

#: the checkpoint schedules (a loop's `checkpoints` param, besides None)
SCHEDULES = (Binomial, EveryK, TwoLevel)


def as_schedule(checkpoints, op: str):
    """`checkpoints` as a schedule param: None (store every step), a
    `Binomial` or an `EveryK`; a `MemoryBudget` is passed on, for the loop
    to resolve once it knows its carry (`MemoryBudget.schedule`)."""
    if checkpoints is None or isinstance(checkpoints, (*SCHEDULES, MemoryBudget)):
        return checkpoints
    if isinstance(checkpoints, (int, np.integer)) and not isinstance(checkpoints, bool):
        return Binomial(int(checkpoints))
    raise InvalidOptionError(f"`checkpoints` must be None, an int (the number of stored carries), "
                             f"`sd.Binomial(s)`, `sd.EveryK(k)` or `sd.MemoryBudget(ram=...)`, "
                             f"got {plain(checkpoints)}.", op=op)


@functools.lru_cache(maxsize=64)
def checkpoint_runs(schedule, length: int) -> Runs:
    """`schedule` on `length` steps, compiled into runs (`_replay`)."""
    return compile_runs(schedule.actions(length), length)


def revolve_actions(length: int, snapshots: int) -> np.ndarray:
    """The binomial schedule for `length` steps and `snapshots` stored
    carries as rows `(kind, a, b)`: kind 0 stores the carry in slot `a`, 1
    advances it from step `a` to step `b`, 2 loads it from slot `a`, 3 runs
    the backward part of step `a` (the carry is then that step's input)."""
    import checkpoint_schedules as cs  # here: only revolve needs it, and it takes ~0.1 s to import

    rows: list[tuple[int, int, int]] = []
    if length == 0:
        return np.zeros((0, 3), np.int32)
    slots: dict[int, int] = {}
    free = list(range(snapshots))[::-1]
    pos = 0
    for act in cs.MultistageCheckpointSchedule(length, snapshots, 0):
        if isinstance(act, cs.Forward):
            assert pos == act.n0, "revolve: the schedule advances from another step"
            if act.write_ics:
                slot = free.pop()
                slots[act.n0] = slot
                rows.append((0, slot, 0))
            end = act.n1 - 1 if act.write_adj_deps else act.n1
            if end > pos:
                rows.append((1, pos, end))
            pos = end
        elif isinstance(act, cs.Reverse):
            assert act.n1 - act.n0 == 1 and pos == act.n0, \
                "revolve: a reverse action must be one step from its input"
            rows.append((3, act.n0, 0))
            pos = -1
        elif isinstance(act, (cs.Copy, cs.Move)):
            rows.append((2, slots[act.n], 0))
            pos = act.n
            if isinstance(act, cs.Move):
                free.append(slots.pop(act.n))
        elif isinstance(act, cs.EndReverse):
            break
    return np.asarray(rows, np.int32)
