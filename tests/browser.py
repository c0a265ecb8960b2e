"""Headless Chromium from Debian's packages, driven by selenium through Debian's chromedriver: the flags it needs on
a machine without network (else it waits on services it cannot reach), and the page of tfm serve used as a user
uses it. ``python tests/browser.py URL SENTENCE PNG`` takes the README's screenshot of a running server."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,1000",
]


def chromium(profile: Path) -> webdriver.Chrome:
    """A headless Chromium with a fresh profile in ``profile`` that keeps the page's console messages."""
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def translate(driver: webdriver.Chrome, sentence: str, timeout: float = 60) -> None:
    """Type ``sentence``, press Enter, and wait for the translation and every cell of the heatmap."""
    box = driver.find_element(By.ID, "source")
    box.clear()
    box.send_keys(sentence, Keys.ENTER)
    WebDriverWait(driver, timeout).until(
        lambda d: d.find_element(By.ID, "status").text == "" and d.find_elements(By.CSS_SELECTOR, "#heatmap td.cell")
    )


def open_page(driver: webdriver.Chrome, url: str, timeout: float = 60) -> None:
    """Load the page and wait until it has read /info (the layer and head menus are filled)."""
    driver.get(url)
    WebDriverWait(driver, timeout).until(lambda d: Select(d.find_element(By.ID, "head")).options)


def screenshot(url: str, sentence: str, output: Path, head: int = 1) -> None:
    """Translate ``sentence`` on the page at ``url``, show ``head`` of the last layer, save a PNG to ``output``."""
    with tempfile.TemporaryDirectory() as profile:
        driver = chromium(Path(profile))
        try:
            open_page(driver, url)
            Select(driver.find_element(By.ID, "head")).select_by_value(str(head))
            translate(driver, sentence)
            driver.save_screenshot(str(output))
        finally:
            driver.quit()


if __name__ == "__main__":
    screenshot(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
