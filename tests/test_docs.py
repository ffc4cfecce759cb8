"""The documentation runs as written: every Python block of every page under
docs/ (and of README.md) is executed, page by page, each page in a fresh
Python process and one namespace that starts empty (a page imports what it
uses, in its first block, and depends on no page run before it: as a reader
who copies it into a new interpreter), and what it shows must be what it
gives.

What a block shows, and how it is checked:

- a comment after an expression (on its line or on the comment lines right
  below it): its value, as `helpers.run_documented` checks it (a literal, a
  printed array, a repr; prose and anything with "..." are not checked);
- a comment naming an exception or a warning (`# ShapeError: matmul: ...`):
  the expression raises (warns) it, with that message up to "while running:";
- a plain ``` block right after the Python block: what the block printed
  (source-line comments `# file.py:12` aside), or, when it names an exception,
  what the block's last statement raised. A shown printout with "..." in it
  is abbreviated: its lines up to the first "..." must begin the printout.

A page whose blocks take more than a few seconds has its test marked slow
(`SLOW` below). Blocks in other languages (shell commands, text) are not run.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

import sciad as sd

from helpers import run_documented

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

# pages whose examples compile long programs (seconds each): left to `-m slow`
SLOW = {"guide/odes.md", "guide/eigen.md", "guide/nonlinear.md", "guide/batching.md",
        "guide/linear-solves.md", "guide/loops.md", "guide/uncertainty.md"}


def _pages():
    found = []
    for base, _, files in os.walk(DOCS):
        for name in files:
            if name.endswith(".md"):
                found.append(os.path.relpath(os.path.join(base, name), DOCS))
    return sorted(found)


_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str):
    """(code, shown, span) for each ```python block of a Markdown text:
    `shown` is the plain ``` block right after it (only blank lines between),
    or None; `span` is where `shown` sits in `text` (start, end)."""
    blocks = [(m.group(1), m.group(2), m.start(), m.end(), m.span(2))
              for m in _BLOCK.finditer(text)]
    out = []
    for i, (lang, body, _, end, _) in enumerate(blocks):
        if lang != "python":
            continue
        shown = span = None
        if i + 1 < len(blocks) and blocks[i + 1][0] == "" \
                and not text[end:blocks[i + 1][2]].strip():
            shown, span = blocks[i + 1][1], blocks[i + 1][4]
        out.append((body, shown, span))
    return out


_RAISES = re.compile(r"([A-Z]\w*(?:Error|Warning)): (.*)", re.S)


def _norm(text: str) -> str:
    return " ".join(text.split())


def _message_head(shown: str) -> str:
    """The shown message up to the context sciad appends (the node, the line),
    or up to a "..." that abbreviates it."""
    return _norm(re.split(r"\n\s*(?:while running:|at \S+:\d+)|\.\.\.", shown)[0])


def _expect_raise(run, shown: str, where: str):
    """`run()` raises (or warns) what `shown` names, with its message."""
    name, message = _RAISES.match(shown.strip()).groups()
    head = _message_head(message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except Exception as e:  # noqa: BLE001 -- the class is checked by name
            assert type(e).__name__ == name, f"{where}: raised {e!r}, shows {name}"
            got = _norm(str(e))
            assert got.startswith(head), f"{where}: raised\n{got}\nshows\n{head}"
            return
    for w in caught:
        if type(w.message).__name__ == name:
            got = _norm(str(w.message))
            assert got.startswith(head), f"{where}: warned\n{got}\nshows\n{head}"
            return
    raise AssertionError(f"{where}: shows {name}, but nothing was raised")


def run_block(code: str, ns: dict, where: str) -> str:
    """Runs one block statement by statement (`helpers.run_documented`, plus
    the statements shown to raise); returns what it printed. Source lines
    are named after the page's file name (`loops.md:5`), as sciad prints
    them in graphs and cost tables."""
    filename = os.path.basename(where.split(" block ")[0])
    lines = code.splitlines()
    printed = io.StringIO()
    for stmt in ast.parse(code).body:
        k = stmt.end_lineno  # the comment on its last line and the lines below
        tail = lines[k - 1][stmt.end_col_offset:].strip()
        comment = [tail[1:].strip()] if tail.startswith("#") else []
        while not tail and k < len(lines) and lines[k].strip().startswith("#"):
            comment.append(lines[k].strip()[1:].strip())
            k += 1
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])
        seg = "\n".join(lines[first - 1:k])
        if _RAISES.match("\n".join(comment)):
            _expect_raise(lambda: exec(compile(seg, filename, "exec"), ns),
                          "\n".join(comment), f"{where}: {seg}")
            continue
        try:
            printed.write(run_documented(seg, ns, filename))
        except AssertionError as e:
            raise AssertionError(f"{where}: {e}") from None
    return printed.getvalue()


def _plain(text: str):
    return [re.sub(r"\s*# [^#]*:\d+$", "", line).rstrip() for line in text.strip("\n").splitlines()]


#: the module each extra brings that a page's block may need
_EXTRA_MODULES = {"plot": ("matplotlib",), "cholmod": ("sparsax", "cvxopt"),
                  "cuda": ("nvidia.cu12",), "fem": ("meshio",)}


def _extra_missing(code: str) -> bool:
    """Whether `code` says it needs an extra (`# needs the [plot] extra`) that
    is not installed here."""
    import importlib.util

    m = re.search(r"needs the \[(\w+)\] extra", code)
    if m is None:
        return False
    names = _EXTRA_MODULES.get(m.group(1), ())
    return not any(importlib.util.find_spec(name.split(".")[0]) for name in names)


def check_page(text: str, ns: dict, where: str, drifted: list | None = None) -> int:
    """Runs every Python block of a page in `ns`; returns how many ran. With
    a list `drifted`, a printout that differs from the one shown is appended
    to it as `(span, printed)` instead of failing (to update a page)."""
    blocks = python_blocks(text)
    for i, (code, shown, span) in enumerate(blocks):
        here = f"{where} block {i + 1}"
        if _extra_missing(code):  # (it says so: see test_blocks_that_need_an_extra_say_so)
            continue
        if shown is not None and _RAISES.match(shown.strip()):
            last = ast.parse(code).body[-1]  # the statement that raises
            first_line = min([last.lineno] + [d.lineno for d in
                                              getattr(last, "decorator_list", ())]) - 1
            run_block("\n".join(code.splitlines()[:first_line]), ns, here)
            seg = "\n".join(code.splitlines()[first_line:])
            _expect_raise(lambda: exec(compile(seg, here, "exec"), ns), shown, here)
            continue
        printed = run_block(code, ns, here)
        if shown is None:
            continue
        want, got = _plain(shown), _plain(printed)
        if any("..." in line for line in want):
            cut = next(j for j, line in enumerate(want) if "..." in line)
            assert got[:cut] == want[:cut], f"{here}: printed\n" + "\n".join(got)
        elif drifted is not None and got != want:
            drifted.append((span, "\n".join(got) + "\n"))
        else:
            assert got == want, f"{here}: printed\n" + "\n".join(got)
    return len(blocks)


def _namespace() -> dict:
    """A page's namespace at its start: empty, so a page imports what it
    uses (a reader copies its first block into a fresh interpreter)."""
    return {"__name__": "__docs__"}


def _check_file(path: str, where: str) -> int:
    """`check_page` of one file; with SCIAD_UPDATE_DOCS=1 in the environment,
    printouts that drifted are rewritten in the file instead of failing (then
    review the diff: values shown in comments are never rewritten)."""
    with open(path) as f:
        text = f.read()
    drifted = [] if os.environ.get("SCIAD_UPDATE_DOCS") == "1" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sd.errors.SciadWarning)
        ran = check_page(text, _namespace(), where, drifted)
    if drifted:
        for (start, end), printed in reversed(drifted):
            text = text[:start] + printed + text[end:]
        with open(path, "w") as f:
            f.write(text)
    return ran


#: a page's run in its own process (`_run_page_alone`): `_check_file` with
#: sciad's checks on (as every test runs: tests/conftest.py), then what the
#: test reads of the process afterwards, as JSON on the last line
_ALONE = """
import json, sys
sys.path.insert(0, {tests!r})
import sciad as sd
import test_docs
with sd.config.checks(True):
    ran = test_docs._check_file({path!r}, {where!r})
rules = {{name: list(sd.graph.lookup_primitive(name).rules)
         for name in {primitives!r}}}
print("\\n" + json.dumps({{"ran": ran, "rules": rules}}))
"""


def _run_page_alone(path: str, where: str, cwd, primitives=()) -> dict:
    """Runs `_check_file(path)` in a fresh Python process (in `cwd`, where a
    page's files are written): no state of another page or test reaches it.
    Returns what it reports: the blocks run, and the rules of `primitives`."""
    code = _ALONE.format(tests=os.path.dirname(os.path.abspath(__file__)), path=path,
                         where=where, primitives=tuple(primitives))
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"{where} (run alone):\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in _pages()])
def test_page_runs_as_shown(page, tmp_path):
    mine = ("my_softplus", "my_scale") if page == "guide/custom-primitives.md" else ()
    got = _run_page_alone(os.path.join(DOCS, page), page, tmp_path, mine)
    if mine:  # the rules the page defines are the rules the primitives have
        assert got["rules"] == {
            "my_softplus": ["impl", "abstract_eval", "jvp", "vjp", "batch", "sparsity"],
            "my_scale": ["impl", "abstract_eval", "jvp", "transpose"]}


def test_readme_runs_as_shown(tmp_path):
    assert _run_page_alone(os.path.join(ROOT, "README.md"), "README.md", tmp_path)["ran"] >= 1


def test_a_page_runs_alone_and_its_failures_reach_the_test(tmp_path):
    """A page runs in a process of its own: a name another page (or test)
    defined is not there, and a block that fails, or shows what it does not
    give, fails the test with the page's name and the block's message."""
    ok = tmp_path / "ok.md"
    ok.write_text("```python\nimport numpy as np\nprint(np.arange(3))\n```\n\n```\n[0 1 2]\n```\n")
    assert _run_page_alone(str(ok), "ok.md", tmp_path)["ran"] == 1
    for text, words in (("```python\nprint(np.arange(3))\n```\n", "NameError"),
                        ("```python\nimport numpy as np\nprint(np.arange(2))\n```\n\n"
                         "```\n[0 1 2]\n```\n", "printed")):
        page = tmp_path / "bad.md"
        page.write_text(text)
        with pytest.raises(AssertionError, match=f"(?s)bad.md \\(run alone\\).*{words}"):
            _run_page_alone(str(page), "bad.md", tmp_path)


def test_the_readme_fits_on_a_few_screens():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert len(f.read().splitlines()) <= 250


def test_the_benchmarks_pages_include_every_report_once():
    """docs/benchmarks/ (a page per family) holds no figures of its own: the
    MkDocs hook (docs/hooks.py) includes each `bench/results/*.md` where a
    page says, each report on one page once."""
    hooks = _hooks()
    folder = os.path.join(DOCS, "benchmarks")
    pages = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            pages[name] = f.read()
    included = [r for page in pages.values() for r in hooks._INCLUDE.findall(page)]
    reports = sorted(name[:-3] for name in os.listdir(os.path.join(ROOT, "bench", "results"))
                     if name.endswith(".md"))
    assert sorted(included) == reports
    assert "index.md" in pages and len(pages) >= 5
    built = "\n".join(hooks.on_page_markdown(page, None, None, None) for page in pages.values())
    assert "<!-- bench:" not in built and not any("| --- |" in p for p in pages.values())
    for name in reports:  # each report's first table row, as the page shows it
        body = hooks.bench_table(name)
        row = next(line for line in body.splitlines() if line.startswith("|"))
        assert row in built


def test_no_list_or_text_runs_into_a_table():
    """A Markdown table ends at a blank line: a line right under a table row
    that is not a row itself is swallowed into the table (a list in
    `bench/results/batch.md` was). Every page and report."""
    paths = [os.path.join(DOCS, p) for p in _pages()]
    results = os.path.join(ROOT, "bench", "results")
    paths += [os.path.join(results, n) for n in sorted(os.listdir(results)) if n.endswith(".md")]
    bad = []
    for path in paths + [os.path.join(ROOT, "README.md")]:
        with open(path) as f:
            lines = f.read().splitlines()
        fence = False
        for i in range(1, len(lines)):
            if lines[i].lstrip().startswith("```"):
                fence = not fence
            if not fence and lines[i - 1].startswith("|") and lines[i].strip() \
                    and not lines[i].startswith("|"):
                bad.append(f"{os.path.relpath(path, ROOT)}:{i + 1}: {lines[i][:60]}")
    assert not bad, "\n".join(bad)


#: what in a block needs an extra, and the extra
_EXTRAS = {r'solver="cholmod"': "cholmod", r'solver="cudss"': "cuda",
           r"^\s*(import|from) matplotlib": "plot", r"^\s*(import|from) meshio": "fem"}


def test_blocks_that_need_an_extra_say_so():
    """A block that runs only with an extra installed starts by saying which
    (`# needs the [cholmod] extra: ...`), so a reader on the base install
    knows why it fails."""
    missing = []
    for page in _pages() + ["../README.md"]:
        with open(os.path.join(DOCS, page)) as f:
            blocks = python_blocks(f.read())
        for i, (code, _, _) in enumerate(blocks):
            for pattern, extra in _EXTRAS.items():
                if re.search(pattern, code, re.M) and f"needs the [{extra}] extra" not in code:
                    missing.append(f"{page} block {i + 1}: [{extra}]")
    assert not missing, missing


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", os.path.join(DOCS, "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_api_reference_check_finds_a_public_name_without_an_entry(tmp_path):
    """The docs build fails where a public name has no entry on its module's
    API page (`docs/hooks.py`'s `on_post_build`): checked here on a made-up
    site that lacks one entry; sciad.numpy's names all have a row of the
    generated table."""
    hooks = _hooks()
    table = hooks.api_table("sciad.numpy")
    names = hooks.public_names("sciad.numpy")
    assert len(names) > 150 and all(f'id="sciad.numpy:{n}"' in table for n in names)
    assert "sin" in names and "| <code id=\"sciad.numpy:sin\">sin</code> | Elementwise" in table
    for module, page in hooks.API_PAGES.items():
        ids = [f'<a id="{module}.{n}"></a>' for n in hooks.public_names(module)]
        if module == "sciad.linalg":
            ids = [i for i in ids if '"sciad.linalg.slogdet"' not in i]
        (tmp_path / "api" / page).mkdir(parents=True)
        (tmp_path / "api" / page / "index.html").write_text("\n".join(ids))
    assert hooks.missing_entries(str(tmp_path)) == ["sciad.linalg.slogdet"]


def test_math_is_rendered_as_mathml():
    """`$...$` and `$$...$$` (arithmatex's spans and blocks) become MathML at
    build time: rendered by the browser, offline."""
    pytest.importorskip("latex2mathml")
    hooks = _hooks()
    html = ('<p>a <span class="arithmatex">\\(x^2 &lt; y\\)</span> and</p>'
            '<div class="arithmatex">\\[\\frac{a}{b}\\]</div>')
    out = hooks.math_to_mathml(html)
    assert "arithmatex" not in out and out.count("<math") == 2
    assert 'display="inline"' in out and 'display="block"' in out and "<mfrac>" in out
    assert "&lt;" in out or "&#x0003C;" in out  # (the escaped "<" is math's, not markup)


#: the main entry points, whose docstrings' examples run as shown (each
#: imports what it uses)
_DOCSTRING_EXAMPLES = ("grad", "value_and_grad", "jvp", "vjp", "hvp", "jacfwd", "jacrev", "vmap",
                       "function", "to_jax", "linalg.solve", "optimize.root",
                       "optimize.minimize", "ode.odeint", "sparse.jacobian_sparsity",
                       "sparse.jacobian", "sparse.assemble_elements", "MemoryBudget", "show_config")


@pytest.mark.parametrize("name", _DOCSTRING_EXAMPLES)
def test_docstring_examples_run_as_shown(name):
    import inspect

    obj = sd
    for part in name.split("."):
        obj = getattr(obj, part)
    doc = inspect.getdoc(obj)
    blocks = python_blocks(doc)
    assert blocks, f"sd.{name} has no example"
    ns = _namespace()
    for i, (code, _, _) in enumerate(blocks):
        run_block(code, ns, f"sd.{name} block {i + 1}")


def test_inline_names_link_to_their_api_entries():
    """An inline `sd.linalg.solve` in a guide page links to its API entry (the
    anchor mkdocstrings makes, or sciad.numpy's table row); names that are
    not public sciad functions, code inside links and the API pages
    themselves are left alone."""
    hooks = _hooks()
    assert hooks.api_anchor("linalg.solve") == ("linalg", "sciad.linalg.solve")
    assert hooks.api_anchor("grad") == ("sciad", "sciad.grad")
    assert hooks.api_anchor("numpy.sin") == ("numpy", "sciad.numpy:sin")
    assert hooks.api_anchor("linalg.no_such_thing") is None
    html = ('<p><code>sd.linalg.solve(A, b)</code>, <code>sd.nope</code>, '
            '<a href="x"><code>sd.grad</code></a>, <code>np.sum</code></p>')
    out = hooks.api_links(html, "guide/odes/")
    assert out.count("<a ") == 2
    assert '<a href="../../api/linalg/#sciad.linalg.solve"><code>sd.linalg.solve(A, b)</code></a>' in out
    assert hooks.api_links(html, "api/linalg/") == html


def test_arguments_become_tables_on_the_api_pages():
    """A docstring's "Arguments:" list (names first, a nested list or a
    paragraph inside an item kept) becomes a table of arguments and
    meanings; a list whose items do not all name an argument stays a list."""
    hooks = _hooks()
    html = ('<p><strong>Arguments:</strong></p>\n<ul>\n'
            '<li><code>f</code>: a function.</li>\n'
            '<li><code>jac</code>: how:\n<ul>\n<li><code>"dense"</code>: dense;</li>\n</ul>\n</li>\n'
            '<li><code>a</code>, <code>b</code> (both optional): bounds.</li>\n</ul>\n<p>after</p>')
    out = hooks.arguments_as_tables(html)
    assert out.count("<tr>") == 4 and "<ul>" in out and out.endswith("<p>after</p>")
    assert '<td><code>jac</code></td><td>how:\n<ul>\n<li><code>"dense"</code>: dense;</li>' in out
    assert "<td><code>a</code>, <code>b</code> (both optional)</td><td>bounds.</td>" in out
    prose = '<p><strong>Arguments:</strong></p>\n<ul>\n<li>anything else</li>\n</ul>'
    assert hooks.arguments_as_tables(prose) == prose
