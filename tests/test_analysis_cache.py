"""sciad's one analysis cache (`sciad._cache`, public through `sciad.config`):
the byte budget drops the least recently used entries, pinned ones stay,
a count limit per owner and kind, an owner's entries go with it, one report,
one clear; and the solvers' analyses live there."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
from sciad import _cache


class Owner:
    """A weakly referencable owner."""


@pytest.fixture
def budget():
    old = _cache.budget()
    yield
    _cache.set_budget(old)


def _entry(owner, key, size, **kw):
    return _cache.cached(owner, "test entry", key, lambda: np.zeros(size, np.uint8), **kw)


def test_hits_make_once_and_are_counted():
    o = Owner()
    before = _cache.info().kinds.get("test entry", _cache.KindInfo(0, 0))
    a = _entry(o, 1, 10)
    assert _entry(o, 1, 10) is a
    k = _cache.info().kinds["test entry"]
    assert (k.hits - before.hits, k.misses - before.misses) == (1, 1)
    _cache.forget(o)


def test_the_budget_drops_the_least_recently_used(budget):
    o = Owner()
    _cache.clear()
    base = _cache.info().bytes  # (pinned entries stay)
    _cache.set_budget(base + 3000)
    a = _entry(o, "a", 1000)
    _entry(o, "b", 1000)
    _entry(o, "a", 1000)  # (a used last: b is the oldest)
    c = _entry(o, "c", 1500)
    assert _entry(o, "a", 1000) is a and _entry(o, "c", 1500) is c  # (kept)
    made = []
    _cache.cached(o, "test entry", "b", lambda: made.append(1) or np.zeros(1000, np.uint8))
    assert made  # (b was dropped and is made again)
    _cache.forget(o)


def test_a_dropped_entry_still_in_use_is_taken_back_not_made_again(budget):
    # a value a program still holds (here: `held`) is not made a second
    # time after the budget dropped its entry; one no one holds is
    o = Owner()
    _cache.clear()
    _cache.set_budget(_cache.info().bytes + 1500)
    made = []

    def make(size):
        def f():
            made.append(size)
            return (np.zeros(size, np.uint8), None, (size, 1))
        return f

    held = _cache.cached(o, "test entry", "held", make(1000))
    _cache.cached(o, "test entry", "gone", make(999))  # (not kept by anyone)
    _cache.cached(o, "test entry", "new", make(1001))  # (drops both: the budget)
    assert made == [1000, 999, 1001]
    again = _cache.cached(o, "test entry", "held", make(1000))
    assert again[0] is held[0] and again[1:] == held[1:] and made == [1000, 999, 1001]
    gc.collect()
    _cache.cached(o, "test entry", "gone", make(999))
    assert made[-1] == 999  # (its value died: made again)
    # `forget` and `clear` forget what was dropped too
    _cache.cached(o, "test entry", "other", make(1002))
    _cache.forget(o)
    _cache.cached(o, "test entry", "held", make(1000))
    assert made[-1] == 1000
    _cache.forget(o)


def test_an_entry_over_the_budget_is_kept_and_pinned_ones_stay(budget):
    o = Owner()
    _cache.set_budget("1KiB")
    pinned = _entry(o, "p", 4000, pinned=True)
    big = _entry(o, "big", 5000)
    assert _entry(o, "big", 5000) is big  # (the newest stays, whatever its size)
    _entry(o, "next", 10)
    assert _entry(o, "p", 4000) is pinned
    _cache.clear()
    assert _entry(o, "p", 4000) is pinned  # (clear keeps pinned entries ...)
    _cache.clear("test entry", pinned=True)  # (... unless asked)
    assert _entry(o, "p", 4000) is not pinned
    _cache.forget(o)


def test_a_count_limit_per_owner_and_kind():
    o, p = Owner(), Owner()
    for k in range(5):
        _entry(o, k, 8, limit=2)
        _entry(p, k, 8, limit=2)
    made = []
    for k in (3, 4):
        _cache.cached(o, "test entry", k, lambda: made.append(k))
    assert not made  # (the two newest kept)
    _cache.cached(o, "test entry", 0, lambda: made.append(0))
    assert made == [0]
    _cache.forget(o)
    _cache.forget(p)


def test_an_owners_entries_go_with_it():
    o = Owner()
    _entry(o, "x", 100_000)
    assert _cache.info().kinds["test entry"].bytes >= 100_000
    del o
    gc.collect()
    assert _cache.info().kinds["test entry"].bytes < 100_000


def test_bytes_parse_and_bad_input_is_refused(budget):
    assert _cache.parse_bytes("512MiB") == 512 * 2**20
    assert _cache.parse_bytes("2GB") == 2 * 10**9
    assert _cache.parse_bytes(1e6) == 10**6
    for bad in ("lots", "-5", -1):
        with pytest.raises(ValueError, match="bytes|>= 0"):
            _cache.parse_bytes(bad)
    sd.config.analysis_cache_budget = "64MiB"
    assert sd.config.analysis_cache_budget == 64 * 2**20


def test_the_solvers_analyses_are_in_it_and_reported():
    n = 30
    M = sp.csr_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (n, n)))
    M.sort_indices()
    f = sd.function(lambda d: sd.linalg.solve(
        sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape), np.ones(n),
        solver="klu"))
    x = np.asarray(f(M.data))
    info = sd.config.analysis_cache_info()
    klu = info.kinds["klu symbolic"]
    assert klu.entries >= 1 and klu.pinned == klu.bytes > 0
    assert info.kinds["index arrays"].entries >= 1
    text = str(info)
    assert text.startswith("analysis cache: ") and "klu symbolic" in text and "(pinned)" in text
    sd.config.clear_analysis_cache()
    assert sd.config.analysis_cache_info().kinds["klu symbolic"].entries == klu.entries
    np.testing.assert_allclose(np.asarray(f(1.5 * M.data)), x / 1.5, rtol=1e-12)
    g = sd.function(lambda d: sd.linalg.solve(
        sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape, tags={"spd"}),
        np.ones(n), solver="cg", preconditioner="amg", tol=1e-12))
    np.testing.assert_allclose(np.asarray(g(M.data)), x, rtol=1e-9)
    kinds = sd.config.analysis_cache_info().kinds
    assert kinds["amg structure"].entries >= 1 and kinds["amg hierarchy"].entries >= 1


def test_an_external_cache_is_reported_and_cleared():
    cleared = []
    _cache.register_external("test library", lambda: {"entries": 3, "bytes": None},
                             lambda: cleared.append(1))
    try:
        info = _cache.info()
        assert info.external["test library"] == {"entries": 3, "bytes": None}
        assert "test library" in str(info) and "kept by the library" in str(info)
        _cache.clear("test library")
        assert cleared == [1]
    finally:
        _cache._external.pop("test library", None)


def test_a_bad_budget_in_the_environment_warns_and_keeps_the_default():
    import subprocess
    import sys

    code = ("import warnings, sys\nwarnings.simplefilter('error')\n"
            "try:\n    import sciad\nexcept RuntimeWarning as e:\n    print('warned:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "SCIAD_ANALYSIS_CACHE_BYTES": "lots"})
    assert "warned: SCIAD_ANALYSIS_CACHE_BYTES='lots' is not a number of bytes" in out.stdout
