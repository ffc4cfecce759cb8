"""The examples run end to end (on smaller sizes) and check themselves."""

from __future__ import annotations

import importlib.util
import os

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart_matches_numpy(capsys):
    _load("quickstart").main(n_calls=3)
    out = capsys.readouterr().out
    assert "graph step(%u: f64[256], %dt: f64[])" in out
    assert "(traced 1x)" in out
    assert "identical text: True" in out

