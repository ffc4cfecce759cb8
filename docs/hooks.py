"""MkDocs hooks (mkdocs.yml `hooks:`): the benchmark tables come from
`bench/results/*.md`, the files the benchmark scripts write, so the site
never holds a second copy of a figure.

In a page, a line `<!-- bench: NAME -->` is replaced by the body of
`bench/results/NAME.md`: its title line dropped, its headings moved one
level down (under the page's own section). A missing file fails the build.
"""

from __future__ import annotations

import functools
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
    """Replaces each `<!-- bench: NAME -->` line with that results file, and
    each `<!-- api-table: MODULE -->` line with the table of its names."""
    markdown = _INCLUDE.sub(lambda m: bench_table(m.group(1)), markdown)
    return _API_TABLE.sub(lambda m: api_table(m.group(1)), markdown)


# ---------------------------------------------------------------------------
# The API reference: a generated table of a module's every public name
# (`<!-- api-table: sciad.numpy -->`: the NumPy-compatible functions are made
# from a table at import, so their docstrings exist at run time only), and a
# check after the build that every public name of every module has an entry
# on its API page (an anchor `module.name` from mkdocstrings, or a row of the
# generated table), which fails the build otherwise

_API_TABLE = re.compile(r"^<!-- api-table: ([\w.]+) -->$", re.M)
#: each public module and its API page (under the site's `api/`)
API_PAGES = {"sciad": "sciad", "sciad.numpy": "numpy", "sciad.linalg": "linalg",
             "sciad.sparse": "sparse", "sciad.fft": "fft", "sciad.optimize": "optimize",
             "sciad.ode": "ode", "sciad.fem": "fem", "sciad.testing": "testing",
             "sciad.errors": "errors", "sciad.graph": "graph", "sciad.config": "config"}


@functools.cache
def public_names(module: str) -> tuple[str, ...]:
    """The public names of `module`: its `__all__`, else every name without
    a leading underscore that is not a module (nor `from __future__`'s).
    (Cached: the cross-links ask it for every inline name of every page.)"""
    import importlib
    import types

    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in dir(mod) if not n.startswith("_") and n != "annotations"]
    return tuple(n for n in names if not isinstance(getattr(mod, n, None), types.ModuleType))


def _summary(obj) -> str:
    """One line on `obj` for the table: its docstring's first sentence, or
    what a constant or a scalar type is."""
    import numpy as np

    if isinstance(obj, type) and issubclass(obj, np.generic):
        return f"NumPy's scalar type `numpy.{obj.__name__}`"
    if not callable(obj):
        return f"the constant `{obj!r}`"
    doc = " ".join((obj.__doc__ or "").strip().split("\n\n")[0].split())
    if not doc:
        return f"NumPy's `numpy.{getattr(obj, '__name__', '')}`, on sciad values"
    first = re.split(r"(?<=\.)\s", doc)[0]
    return first.replace("|", "\\|")


def api_table(module: str) -> str:
    """A Markdown table of `module`'s public names, each with its summary
    and an anchor `module:name`."""
    import importlib

    mod = importlib.import_module(module)
    rows = ["| name | what it is |", "| --- | --- |"]
    for name in public_names(module):
        rows.append(f'| <code id="{module}:{name}">{name}</code> | '
                    f"{_summary(getattr(mod, name))} |")
    return "\n".join(rows) + "\n"


def missing_entries(site_dir: str) -> list[str]:
    """The public names without an entry on their module's API page."""
    missing = []
    for module, page in API_PAGES.items():
        path = os.path.join(site_dir, "api", page, "index.html")
        with open(path, encoding="utf-8") as f:
            ids = set(re.findall(r'id="([\w.:]+)"', f.read()))
        missing += [f"{module}.{n}" for n in public_names(module)
                    if f"{module}.{n}" not in ids and f"{module}:{n}" not in ids]
    return missing


def on_post_build(config):
    """Fails the build where a public name has no entry in the API reference."""
    missing = missing_entries(config["site_dir"])
    if missing:
        from mkdocs.exceptions import PluginError

        raise PluginError("public names without an entry in the API reference (add them "
                          "to the module's page under docs/api/, or give them a "
                          "docstring): " + ", ".join(missing))


# ---------------------------------------------------------------------------
# Math: `$...$` and `$$...$$` in a page (kept intact by pymdownx.arithmatex's
# generic mode) become MathML, which browsers render natively: no script, no
# fonts fetched, the same offline

_MATH = re.compile(r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S)


def math_to_mathml(html: str) -> str:
    """`html` with each of arithmatex's math spans (inline) and blocks
    (display) as MathML."""
    import html as _html

    from latex2mathml.converter import convert

    def one(m):
        display = "block" if m.group(2) == "[" else "inline"
        return convert(_html.unescape(m.group(3)).strip(), display=display)

    return _MATH.sub(one, html)


def on_page_content(html, page, config, files):  # noqa: ARG001 -- MkDocs' signature
    """The page's math as MathML, its inline names of sciad functions linked
    to their API entries, and (on the API pages) arguments as tables."""
    url = page.url if page is not None else ""
    html = api_links(math_to_mathml(html), url)
    return arguments_as_tables(html) if url.startswith("api/") else html


# ---------------------------------------------------------------------------
# Cross-links: an inline `sd.linalg.solve` (or `sd.grad(f)`) in a page links
# to its entry in the API reference

_CODE_NAME = re.compile(r"<code>(?:sd|sciad)\.([A-Za-z_][\w.]*)(\([^<]*\))?</code>")
_LINK = re.compile(r"(<a\b[^>]*>.*?</a>)", re.S)


def api_anchor(dotted: str) -> tuple[str, str] | None:
    """`(page, anchor)` of the API entry of `sciad.<dotted>`, or None: the
    longest public module prefix that has a page, and a public name of it."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        module = ".".join(["sciad"] + parts[:cut])
        rest = parts[cut:]
        if module in API_PAGES and len(rest) == 1 and rest[0] in public_names(module):
            sep = ":" if module == "sciad.numpy" else "."
            return API_PAGES[module], f"{module}{sep}{rest[0]}"
    return None


def api_links(html: str, page_url: str) -> str:
    """`html` (a page at `page_url`, as `guide/odes/`) with each inline code
    naming a public sciad function linked to its API entry (not inside a
    link already, nor on the API pages themselves)."""
    if page_url.startswith("api/"):
        return html
    prefix = "../" * page_url.count("/")

    def one(m):
        found = api_anchor(m.group(1))
        if found is None:
            return m.group(0)
        page, anchor = found
        return f'<a href="{prefix}api/{page}/#{anchor}">{m.group(0)}</a>'

    pieces = _LINK.split(html)
    return "".join(p if i % 2 else _CODE_NAME.sub(one, p) for i, p in enumerate(pieces))


# ---------------------------------------------------------------------------
# Parameters as tables: a docstring's "**Arguments:**" list (`- `name`: what
# it is`, as every public docstring writes it) becomes a two-column table on
# the API pages

_ARGS_HEAD = re.compile(r"<p><strong>Arguments:</strong></p>\s*<ul>")
_TAG = re.compile(r"<(/?)(ul|li)\b[^>]*>")
_ITEM = re.compile(r"\s*(<p>)?(<code>[^<]+</code>(?:(?:, | / )<code>[^<]+</code>)*"
                   r"(?: \([^:]*?\))?)\s*:\s*(.*)", re.S)


def _top_items(html: str, start: int):
    """The top-level `<li>` contents of the `<ul>` whose content starts at
    `start`, and where that list ends (after its `</ul>`); None if it is not
    well formed."""
    depth, items, item_start = 0, [], None
    for m in _TAG.finditer(html, start):
        closing, tag = m.group(1) == "/", m.group(2)
        if tag == "ul":
            if closing and depth == 0:
                return items, m.end()
            depth += -1 if closing else 1
        elif depth == 0:
            if not closing:
                item_start = m.end()
            elif item_start is not None:
                items.append(html[item_start:m.start()])
                item_start = None
    return None


def arguments_as_tables(html: str) -> str:
    """`html` with each "Arguments:" list whose every item names its argument
    first (`<code>x</code>: ...`) as a table of arguments and meanings."""
    out, pos = [], 0
    for m in _ARGS_HEAD.finditer(html):
        if m.start() < pos:
            continue
        found = _top_items(html, m.end())
        if found is None:
            continue
        items, end = found
        rows = [_ITEM.fullmatch(item) for item in items]
        if not rows or any(r is None for r in rows):
            continue
        # (a loose list's items are paragraphs: the first one's tag stays
        # with its text)
        body = "".join(f"<tr><td>{r.group(2)}</td><td>{r.group(1) or ''}{r.group(3).strip()}"
                       "</td></tr>" for r in rows)
        out += [html[pos:m.start()], "<p><strong>Arguments:</strong></p>",
                '<table class="sciad-arguments"><thead><tr><th>argument</th><th>meaning</th>'
                f"</tr></thead><tbody>{body}</tbody></table>"]
        pos = end
    return "".join(out) + html[pos:]
