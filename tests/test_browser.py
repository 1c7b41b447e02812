"""The app in a real browser: headless Chromium driven by Playwright.

Needs Debian's ``chromium`` package and the ``playwright`` Python package (CI installs both); where
either is missing the tests skip and say which. (The video tab's browser check, arrow keys moving
the player on the displayed frames, lands with the shipped world model of issue 4.)
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import app  # noqa: E402

playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                 "(pip install playwright; the browser is Debian's chromium)")
CHROMIUM = app.find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")



@pytest.fixture(scope="module")
def url():
    from visualspec.cli import load_pipeline

    with app.serve(app.build_app(load_pipeline(None), app.load_world(None))) as address:
        yield address


@pytest.fixture(scope="module")
def page(url):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser.new_page()
        browser.close()


def test_the_page_loads_and_generates_an_image(page, url):
    page.goto(url)
    page.click("#generate")
    page.wait_for_function("() => { const img = document.querySelector('#image img');"
                           " return img && img.complete && img.naturalWidth > 0; }", timeout=120_000)
    size = page.evaluate("() => document.querySelector('#image img').naturalWidth")
    assert size == 64
    assert '"target_forwards"' in page.inner_text("#stats")
