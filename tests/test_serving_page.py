"""The page of tfm serve in a real browser (headless Chromium): a typed sentence gets its translation and the
heatmap of the chosen layer and head, the data POST /attention returns; an error shows as a line on the page.
Skipped where Debian's chromium is not installed, unless TFM_BROWSER=required (CI installs it and sets that)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    if os.environ.get("TFM_BROWSER") == "required":
        pytest.fail("TFM_BROWSER=required but /usr/bin/chromium is absent", pytrace=False)
    pytest.skip("no Debian chromium here: apt-get install -y chromium chromium-driver", allow_module_level=True)

from browser import chromium, open_page, translate  # noqa: E402 - selenium is imported only where chromium is
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from serve_helpers import post, serve  # noqa: E402

SENTENCE = "Ein Mann fährt Fahrrad."


@pytest.fixture(scope="module")
def url(tiny_run, tmp_path_factory):
    proc, url = serve(tiny_run.run_dir / "best", tmp_path_factory.mktemp("serve") / "serve.err")
    yield url
    proc.p.send_signal(signal.SIGTERM)
    proc.finish()


@pytest.fixture()
def driver(tmp_path):
    driver = chromium(tmp_path / "profile")
    yield driver
    driver.quit()


def heatmap(driver) -> tuple[list[str], list[str], list[list[float]]]:
    """The drawn heatmap: column tokens, row tokens, and the weight each cell's tooltip names ('row → column: w'),
    checked to name its own row and column."""
    table = driver.find_element(By.ID, "heatmap")
    columns = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")][1:]
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    names = [row.find_element(By.TAG_NAME, "th").text for row in rows]
    weights = []
    for name, row in zip(names, rows):
        titles = [td.get_attribute("title") for td in row.find_elements(By.CSS_SELECTOR, "td.cell")]
        assert [t.rsplit(": ", 1)[0] for t in titles] == [f"{name} → {c}" for c in columns]
        weights.append([float(t.rsplit(": ", 1)[1]) for t in titles])
    return columns, names, weights


def test_a_typed_sentence_gets_its_translation_and_the_heatmap_of_the_chosen_head(url, driver, tmp_path):
    open_page(driver, url)
    assert "de → en" in driver.find_element(By.ID, "model").text
    layers = Select(driver.find_element(By.ID, "layer"))
    assert layers.first_selected_option.text == str(len(layers.options))  # the last layer by default
    translate(driver, SENTENCE)
    status, expected = post(url, "/attention", {"text": SENTENCE})
    assert status == 200
    assert driver.find_element(By.ID, "translation").text == expected["translation"]
    columns, rows, drawn = heatmap(driver)
    assert (columns, rows) == (expected["source"], expected["output"])
    weights = expected["weights"]
    assert drawn == [pytest.approx(row, abs=6e-4) for row in weights[0]]  # the page shows 3 decimals

    Select(driver.find_element(By.ID, "head")).select_by_value("2")
    WebDriverWait(driver, 30).until(lambda d: "head 2" in d.find_element(By.ID, "title").text)
    assert heatmap(driver)[2] == [pytest.approx(row, abs=6e-4) for row in weights[1]]

    shot = tmp_path / "serve.png"
    driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_a_refused_sentence_shows_the_servers_line_and_the_page_goes_on(url, driver):
    open_page(driver, url)
    driver.find_element(By.ID, "source").send_keys("   \n")
    WebDriverWait(driver, 30).until(lambda d: "empty" in d.find_element(By.ID, "status").text)
    translate(driver, SENTENCE)
    assert driver.find_element(By.ID, "translation").text
