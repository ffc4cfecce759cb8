"""`import sciad` stays light: the optional heavy dependencies load on first
use (pyamg when an AMG hierarchy is built, scikit-fem with `sd.fem`), and so
do lineax and equinox (when a Krylov solve or an ODE is traced) and
`scipy.optimize` (`sd.optimize.minimize`). Each check runs in a fresh child
process, whose `sys.modules` holds only what `import sciad` loaded.

The time `import sciad` takes is measured by `bench/import_time.py`, not
here: a timing assertion would be flaky on a loaded machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import sciad as sd

#: modules `import sciad` must not load: the optional heavy dependencies
#: (the style guide's rule) and the libraries only a traced solve, an ODE or
#: `minimize` needs
NOT_AT_IMPORT = ("pyamg", "skfem", "lineax", "equinox", "scipy.optimize")


def _child(code: str) -> dict:
    """Runs `code` in a fresh interpreter; returns the JSON it printed last."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_import_loads_no_heavy_dependency():
    out = _child(f"""
        import json, sys
        import sciad
        print(json.dumps([m for m in {NOT_AT_IMPORT!r} if m in sys.modules]))
        """)
    assert out == [], f"`import sciad` loaded {out}"


def test_fem_loads_on_first_use():
    out = _child("""
        import json, sys
        import sciad as sd
        before = "skfem" in sys.modules or "sciad.fem" in sys.modules
        listed = "fem" in dir(sd)
        assemble = sd.fem.assemble                       # the attribute imports it
        import sciad.fem
        from sciad import fem
        print(json.dumps({
            "before": before, "listed": listed, "after": "skfem" in sys.modules,
            "same": sd.fem is sciad.fem is fem is sys.modules["sciad.fem"],
            "boundary": all(getattr(getattr(fem, n), "_sciad_boundary", False)
                            for n in ("assemble", "condense", "solve", "interpolate",
                                      "probes")),
            "assemble": assemble is fem.assemble, "pyamg": "pyamg" in sys.modules}))
        """)
    assert out == {"before": False, "listed": True, "after": True, "same": True,
                   "boundary": True, "assemble": True, "pyamg": False}


def test_import_sciad_fem_first():
    # `import sciad.fem` before any attribute access: the public functions
    # are API boundaries all the same
    out = _child("""
        import json, sys
        import sciad.fem
        print(json.dumps([sciad.fem.assemble._sciad_boundary, "skfem" in sys.modules]))
        """)
    assert out == [True, True]


def test_amg_loads_pyamg_on_first_use():
    out = _child("""
        import json, sys
        import numpy as np
        import scipy.sparse as sp
        from sciad.solvers.iterative import _amg
        before = "pyamg" in sys.modules
        n = 50
        a = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1],
                     format="csr")
        s = _amg.build_structure(a.shape, a.indptr, a.indices, max_coarse=10)
        print(json.dumps([before, "pyamg" in sys.modules, len(s.levels) > 0]))
        """)
    assert out == [False, True, True]


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        sd.not_a_module  # noqa: B018
