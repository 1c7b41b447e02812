"""The app in a real browser: headless Chromium driven by Playwright.

Needs Debian's ``chromium`` package and the ``playwright`` Python package (CI installs both); where
either is missing the tests skip and say which. The video check needs the shipped world model.
"""

import time

import numpy as np
import pytest

from visualspec.tools import app  # noqa: E402
from visualspec.tools.serve import find_chromium, serve  # noqa: E402

playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                 "(pip install playwright; the browser is Debian's chromium)")
CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")

from benchmarks.browser_fps import open_video_tab  # noqa: E402
from visualspec.worlds import arena  # noqa: E402


@pytest.fixture(scope="module")
def pipe():
    from visualspec.tools.loading import load_pipeline

    return load_pipeline(None)


@pytest.fixture(scope="module")
def url(pipe):
    world = app.load_world(None)
    assert world is not None, "the shipped world model (assets/arena-nfd) is missing"
    with serve(app.build_app(pipe, world)) as address:
        yield address


@pytest.fixture(scope="module")
def page(url):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser.new_page()
        browser.close()


def displayed_frame(page) -> np.ndarray:
    data = page.evaluate("() => Array.from(document.getElementById('arena-canvas')"
                         ".getContext('2d').getImageData(0, 0, 64, 64).data)")
    return np.array(data, dtype=np.uint8).reshape(64, 64, 4)[..., :3]


def test_the_page_loads_and_generates_an_image(page, url):
    page.goto(url)
    page.click("#generate")
    page.wait_for_function("() => { const img = document.querySelector('#image img');"
                           " return img && img.complete && img.naturalWidth > 0; }", timeout=120_000)
    size = page.evaluate("() => document.querySelector('#image img').naturalWidth")
    assert size == 384  # the 64 x 64 image, shown 6 times as large, pixel for pixel
    assert '"target_forwards"' in page.inner_text("#stats")


def message_for(page, url, prompt: str, text: str):
    """Generate from ``prompt`` in a fresh page; the message ``text`` once the page shows it."""
    page.goto(url)
    page.fill("#prompt textarea", prompt)
    page.click("#generate")
    message = page.get_by_text(text)
    message.wait_for(state="visible", timeout=60_000)
    return message


def test_an_unknown_word_shows_the_pipelines_message_in_the_page(page, url):
    message = message_for(page, url, "a photo of a zebra", "has words the text encoder does not know: ['zebra']")
    assert message.is_visible()


def test_an_empty_prompt_shows_the_pipelines_message_in_the_page_until_closed(page, url):
    message = message_for(page, url, "", "the prompt is empty")
    time.sleep(11)  # longer than Gradio shows a message by default (10 s)
    assert message.is_visible()


def test_an_example_prompt_fills_the_box_and_the_vocabulary_opens(page, url, pipe):
    page.goto(url)
    example = app.example_prompts(pipe)[1]
    page.get_by_text(example, exact=True).click()
    playwright.expect(page.locator("#prompt textarea")).to_have_value(example, timeout=10_000)
    words = page.locator("#vocabulary")
    assert not words.get_by_text("triangles").is_visible()  # collapsed until opened
    words.get_by_text("Words the model knows").click()
    words.get_by_text("triangles", exact=False).wait_for(state="visible", timeout=10_000)


def table_in_page(page, selector: str) -> list[list[str]]:
    """The rows of a Gradio Dataframe as the page shows them (headings first), empty rows left out."""
    rows = page.evaluate(f"""() => Array.from(document.querySelectorAll('{selector} tr, {selector} [role=row]'))
        .map(r => Array.from(r.querySelectorAll('th, td, [role=cell], [role=gridcell], [role=columnheader]'))
        .map(c => c.innerText.trim()))""")
    return [row for row in rows if any(row)]


def test_ar_vs_sjd_shows_each_value_under_its_heading_and_says_why_the_images_differ(page, url):
    page.goto(url)
    page.click("#compare")
    page.wait_for_function("() => document.querySelectorAll('#ar-image img, #sjd-image img').length == 2",
                           timeout=120_000)
    assert page.get_by_text(app.COMPARE_NOTE).is_visible()
    page.wait_for_function("() => document.querySelector('#compare-table').innerText.includes('target forwards')")
    headings, *rows = table_in_page(page, "#compare-table")
    assert headings == app.COMPARE_HEADERS
    table = {row[0]: dict(zip(headings[1:], map(float, row[1:]))) for row in rows}
    assert set(table) == {"target forwards", "accepted tokens per step", "seconds"}
    forwards, accepted = table["target forwards"], table["accepted tokens per step"]
    assert forwards["AR"] == 256 and forwards["SJD"] < 256 and accepted["AR"] == 1 and accepted["SJD"] > 1
    for measure, row in table.items():  # the last column is the ratio of the two before it
        assert row["AR / SJD"] == pytest.approx(row["AR"] / row["SJD"], rel=0.03, abs=0.01), measure


def frames_shown(page) -> int:
    """How many frames the arena page has displayed so far."""
    return page.evaluate("() => window.visualspecArena.framesShown()")


def player_position(page, frames: int = 5):
    """The player's median position over a few displayed frames (None if it is on none of them)."""
    found = []
    for _ in range(frames):
        position = arena.detect_player(displayed_frame(page))
        if position is not None:
            found.append(position)
        time.sleep(0.05)
    return np.median(found, axis=0) if found else None


def test_arrow_keys_move_the_player_on_the_displayed_frames(page, url):
    open_video_tab(page, url)
    time.sleep(0.3)
    start = player_position(page)
    assert start is not None, "no player on the displayed frames"
    key, sign = ("ArrowRight", 1) if start[0] < 32 else ("ArrowLeft", -1)  # towards the far wall
    # hold the key for 20 displayed frames, however long a shared CPU takes to show them (the frame
    # rate is the benchmark's business, not this test's)
    before, deadline = frames_shown(page), time.time() + 30
    page.keyboard.down(key)
    while frames_shown(page) - before < 20 and time.time() < deadline:
        time.sleep(0.05)
    page.keyboard.up(key)
    shown = frames_shown(page) - before
    time.sleep(0.2)
    end = player_position(page)
    assert end is not None, "the player vanished"
    # the game moves 2 px per frame and the shipped model about 85 % as far (assets/arena-nfd/README.md), so 20
    # displayed frames under the key move the player about 34 px or to the wall (at least 26 px away): ask
    # for 8, which a world ignoring the keys (drift under 2 px per 10 frames) does not reach
    assert shown >= 20 and sign * (end[0] - start[0]) >= 8, (start, end, shown)
    assert page.inner_text("#arena-hit") != "-"  # the page shows the speculation hit rate
