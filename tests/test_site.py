"""The documentation site as a newcomer meets it, in a headless browser
(Debian's Chromium and ChromeDriver, driven by Selenium): the home page
leads, through the navigation and through search, to the install page, the
solver table, the GPU page and the tutorial; the main pages render
(screenshots that are not blank) with no code block scrolling sideways at
1280 px; nothing is fetched from another host.

Marked `browser`, left out of the default run: CI runs it after building the
site (`SCIAD_SITE_DIR=site pytest -m browser tests/test_site.py`, see
`.ci/run`); without `SCIAD_SITE_DIR` it builds the site itself (about a
minute). Skipped where Chromium, ChromeDriver or Selenium is missing
(`apt-get install chromium chromium-driver`; `pip install -e ".[docs]"`),
except where `SCIAD_REQUIRE_BROWSER` is set, as in CI: a failure there.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.browser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

#: the pages a newcomer reads first, whose code blocks must not scroll
MAIN_PAGES = ["", "install/", "tutorial/", "getting-started/", "examples/"] + [
    f"guide/{p}/" for p in ("linear-solves", "uncertainty", "fft", "loops", "batching", "gpu",
                            "cluster", "eigen", "nonlinear", "odes", "fem",
                            "custom-primitives", "jax-interop", "errors")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's directory: `SCIAD_SITE_DIR`, else built here."""
    given = os.environ.get("SCIAD_SITE_DIR")
    if given:
        path = given if os.path.isabs(given) else os.path.join(ROOT, given)
        assert os.path.isfile(os.path.join(path, "index.html")), f"no site built in {path}"
        return path
    out = str(tmp_path_factory.mktemp("site"))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", out],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def server(site):
    """The site served over HTTP on a free local port (search's index is
    fetched by a web worker, which a `file://` page may not start)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            functools.partial(Quiet, directory=site))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    missing = "Chromium and ChromeDriver (apt-get install chromium chromium-driver)" \
        if CHROMIUM is None or CHROMEDRIVER is None else None
    try:
        from selenium import webdriver
    except ImportError:
        missing = missing or 'Selenium (pip install -e ".[docs]")'
    if missing:  # (CI requires them: `SCIAD_REQUIRE_BROWSER=1`, a failure there)
        if os.environ.get("SCIAD_REQUIRE_BROWSER"):
            pytest.fail(f"needs {missing}")
        pytest.skip(f"needs {missing}")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, what, timeout=30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: what(d))


_CLICK_NAV = """
    const links = Array.from(document.querySelectorAll('nav.md-nav--primary a.md-nav__link'));
    const link = links.find(a => a.href.endsWith(arguments[0]));
    if (!link) return false;
    link.click();  // (a collapsed section's link too)
    return true;"""


def _click_nav_link(driver, href_end: str) -> None:
    """Clicks the navigation's link to the page whose address ends so, found
    and clicked in one script (the theme's script may rebuild the navigation
    after the load event: an element found before would be stale)."""
    from selenium.common.exceptions import TimeoutException

    try:
        _wait(driver, lambda d: d.execute_script(_CLICK_NAV, href_end), timeout=15)
    except TimeoutException:
        pytest.fail(f"the navigation has no link to {href_end}")


def _heading(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, ".md-content h1").text


@pytest.mark.parametrize("href, title, anchor", [
    ("install/", "Install", None),
    ("guide/linear-solves/", "Linear solves", "choosing-a-solver"),
    ("guide/gpu/", "GPU", None),
    ("tutorial/", "inverse problem", None),
])
def test_the_home_page_leads_there_by_the_navigation(browser, server, href, title, anchor):
    browser.get(server)
    _click_nav_link(browser, href)
    _wait(browser, lambda d: d.current_url.endswith(href))
    assert title.lower() in _heading(browser).lower()
    if anchor is not None:
        from selenium.webdriver.common.by import By

        # (the solver table: a section with a table of solvers under it)
        section = browser.find_element(By.ID, anchor)
        table = section.find_element(By.XPATH, "following::table[1]")
        assert "auto" in table.text and "klu" in table.text.lower()


@pytest.mark.parametrize("query, href", [
    ("install", "install/"),
    ("choosing a solver", "guide/linear-solves/"),
    ("GPU", "guide/gpu/"),
    ("inverse problem", "tutorial/"),
])
def test_search_finds_it_first(browser, server, query, href):
    from selenium.webdriver.common.by import By

    browser.get(server)
    # (the page may still be loading on a busy machine: wait for the box)
    box = _wait(browser, lambda d: (d.find_elements(By.CSS_SELECTOR, "input.md-search__input")
                                    or [None])[0], timeout=20)
    browser.execute_script("arguments[0].focus();", box)
    box.send_keys(query)
    # (the first result is the page, the sections under it come after; the
    # results of a prefix typed so far show first: wait for the query's)
    def first(d):
        return [a.get_attribute("href") for a in d.find_elements(
            By.CSS_SELECTOR, ".md-search-result__list > li > a")][:1]

    from selenium.common.exceptions import TimeoutException

    try:
        _wait(browser, lambda d: first(d) == [server + href], timeout=20)
    except TimeoutException:
        pytest.fail(f"searching {query!r}: the first result is {first(browser)}, not {href}")


def test_main_pages_render_and_no_code_block_scrolls(browser, server, tmp_path):
    """Every main page: a screenshot that is not blank, and every code block
    as wide as its column at most (it would scroll sideways otherwise)."""
    from PIL import Image

    overflowing = []
    for page in MAIN_PAGES:
        browser.get(server + page)
        assert _heading(browser) or page == "", page
        shot = tmp_path / f"{page.strip('/').replace('/', '-') or 'home'}.png"
        browser.save_screenshot(str(shot))
        with Image.open(shot) as im:
            assert im.size[0] >= 1200, (page, im.size)
            colors = im.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colors is None or len(colors) > 50, f"{page}: a blank screenshot"
        widths = browser.execute_script("""
            return Array.from(document.querySelectorAll('.md-content pre > code')).map(
                c => [c.scrollWidth, c.clientWidth, c.textContent.slice(0, 60)]);""")
        overflowing += [(page, text) for scroll, client, text in widths if scroll > client + 1]
    assert not overflowing, f"code blocks that scroll sideways at 1280 px: {overflowing}"


def test_nothing_is_fetched_from_another_host(browser, server):
    # (no fonts or scripts from a CDN: the site works offline)
    for page in ("", "guide/odes/"):
        browser.get(server + page)
        hosts = browser.execute_script("""
            return performance.getEntriesByType('resource').map(e => new URL(e.name).host);""")
        assert all(h.startswith("127.0.0.1") for h in hosts), (page, sorted(set(hosts)))
