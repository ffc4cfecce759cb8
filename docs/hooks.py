"""MkDocs hooks (mkdocs.yml `hooks:`): the benchmark tables come from
`bench/results/*.md`, the files the benchmark scripts write, so the site
never holds a second copy of a figure.

In a page, a line `<!-- bench: NAME -->` is replaced by the body of
`bench/results/NAME.md`: its title line dropped, its headings moved one
level down (under the page's own section). A missing file fails the build.
"""

from __future__ import annotations

import os
import re

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INCLUDE = re.compile(r"^<!-- bench: ([\w-]+) -->$", re.M)


def bench_table(name: str) -> str:
    """The body of `bench/results/<name>.md`, ready to sit under a `##` heading."""
    path = os.path.join(_ROOT, "bench", "results", name + ".md")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    out = []
    fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,4} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 -- MkDocs' signature
    """Replaces each `<!-- bench: NAME -->` line with that results file."""
    return _INCLUDE.sub(lambda m: bench_table(m.group(1)), markdown)
