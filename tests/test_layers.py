"""The layers import one way (DESIGN.md, "Layout and layers"): checked with
import-linter against the contract in pyproject.toml ([tool.importlinter])."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_layers_import_one_way():
    # a fresh interpreter in the repository root: the contract is read from its
    # pyproject.toml and checks the `sciad` there, without a cache directory
    code = ("import sys; from importlinter import cli; sys.exit(cli.lint_imports("
            "config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_rules_use_the_op_layer():
    # derivative rules import `sciad._ops` at module top, not `sciad.numpy` lazily
    text = "\n".join(p.read_text() for p in (ROOT / "sciad").rglob("*.py"))
    assert "_LazyNumpy" not in text
