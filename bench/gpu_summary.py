"""The GPU check's summary: every target the GPU benchmarks marked, in one file.

`bench/gpu_check.sh` runs the GPU tests and benchmarks; each benchmark writes
its own `<name>_<device>.md` with its targets marked "yes" or "**NO**". This
script gathers, from the result files named on its command line, every line
or table row that marks a target, and the GPU tests' outcome (the pytest
logs' last lines), into `gpu_<device>.md`:

    python bench/gpu_summary.py --device "NVIDIA H200" --out DIR \\
        --tests DIR/gpu_tests.log DIR/gpu_budget_NVIDIA_H200.md ...

A target counts as marked where a line holds "target" (any case) and a
"yes" or "**NO**" cell or word.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

_MARK = re.compile(r"(\*\*NO\*\*|\byes\b)")


def targets(text: str) -> list[tuple[str, bool]]:
    """`(line, met)` for each line of `text` that marks a target."""
    out = []
    table_marks = False
    for line in text.splitlines():
        if line.startswith("| target"):
            table_marks = True
            continue
        if table_marks and not line.startswith("|"):
            table_marks = False
        marks = _MARK.findall(line)
        if not marks or not (table_marks or "target" in line.lower()):
            continue
        if line.startswith("|---"):
            continue
        text_line = line.strip().lstrip("- ").strip()
        out.append((text_line, all(m == "yes" for m in marks)))
    return out


def tests_outcome(path: str) -> str:
    """The pytest summary line of the log at `path` (or why there is none)."""
    try:
        with open(path) as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError as e:
        return f"no log ({e.strerror})"
    found = [ln for ln in lines if re.search(r"\d+ (passed|failed|error)", ln)]
    return found[-1].strip("= ") if found else (lines[-1] if lines else "empty log")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tests", nargs="*", default=[])
    ap.add_argument("--machine-from", help="a result file whose machine lines to use (a "
                    "summary made on another machine than the runs')")
    ap.add_argument("--note", default="", help="a paragraph under the title (how the runs "
                    "were made)")
    ap.add_argument("results", nargs="*")
    a = ap.parse_args()
    head = _harness.report_head(f"GPU check on {a.device}",
                                "bench/gpu_check.sh (bench/gpu_summary.py)",
                                _harness.machine_info())
    if a.machine_from:
        with open(a.machine_from) as fh:
            theirs = [ln for ln in fh.read().splitlines()
                      if ln.startswith(("Machine:", "Python "))]
        head = [ln for ln in head if not ln.startswith(("Machine:", "Python "))] + theirs
    parts = ["\n".join(head)] + (["", a.note] if a.note else []) + ["", "## GPU tests", ""]
    for log in a.tests:
        parts.append(f"- `{os.path.basename(log)}`: {tests_outcome(log)}")
    parts += ["", "## Targets", "", "| from | target | met |", "|---|---|---|"]
    met_all = True
    for path in a.results:
        if not os.path.exists(path):
            parts.append(f"| `{os.path.basename(path)}` | not written (the step failed or ran "
                         "past its time limit: see gpu_check.log) | **NO** |")
            met_all = False
            continue
        with open(path) as fh:
            for line, met in targets(fh.read()):
                cell = line.replace("|", "/").strip("/ ")
                parts.append(f"| `{os.path.basename(path)}` | {cell} | "
                             f"{_harness.yes_no(met)} |")
                met_all &= met
    parts += ["", f"Every target met: {_harness.yes_no(met_all)}."]
    name = "gpu_" + a.device.replace(" ", "_") + ".md"
    _harness.write_text(os.path.join(a.out, name), "\n".join(parts) + "\n")
    print("\n".join(parts))


if __name__ == "__main__":
    main()
