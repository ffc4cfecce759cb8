"""`sd.show_config()`: the install check the install page shows."""

from __future__ import annotations

import io

import jax

import sciad as sd
from sciad.solvers import names


def test_show_config_reports_versions_backend_extensions_and_solvers():
    out = io.StringIO()
    config = sd.show_config(file=out)
    text = out.getvalue()
    assert text.strip() == str(config)
    assert text.startswith(f"sciad {sd.__version__} (Python ")
    assert config.backend == jax.default_backend() == "cpu"
    assert f"small loops compiled as one function: {sd.config.loops_policy}\n" in text
    # every registered linear solver, each available here or saying why not
    assert tuple(s.name for s in config.solvers) == names("linear")
    status = {s.name: s for s in config.solvers}
    assert status["lu"].available and status["splu"].available and status["klu"].available
    assert not status["cudss"].available and "NVIDIA GPU" in status["cudss"].why
    assert "sciad[cuda]" in status["cudss"].why        # (what to install)
    assert status["splu"].where == "host" and status["klu"].where == "device"
    # the compiled extensions: each built here (this machine has a compiler)
    assert config.compiler and all(e.built for e in config.extensions), config.extensions
    assert config.auto == {"dense": "lu", "sparse": "klu", "sparse spd": "klu"}


def test_show_config_says_when_there_is_no_compiler(monkeypatch):
    from sciad.solvers import _build

    monkeypatch.setattr(_build.shutil, "which", lambda name: None)
    out = io.StringIO()
    config = sd.show_config(file=out)
    assert config.compiler is None and "none found (set $CXX or install g++)" in out.getvalue()
