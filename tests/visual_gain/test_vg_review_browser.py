"""Headless Chromium opens an exported review page, clicks accept/reject, saves; `review fit` uses the file.

Needs Debian's chromium + chromium-driver and selenium (skipped with the reason when absent). The page
is opened from file:// and loads nothing remote; Chromium's own network features are switched off.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
from vg_helpers import scored_page

from pipelines.cli.review import register
from tests.browser import HAVE_CHROMIUM, NO_CHROMIUM, chromium_driver
from visual_gain.review import ReviewConfig, export_review
from visual_gain.thresholds import Thresholds

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not HAVE_CHROMIUM, reason=NO_CHROMIUM),
]


def test_click_review_save_and_fit(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    true_t = 0.045  # the simulated reviewer accepts exactly the pages at or above this ΔH
    pages = [scored_page(0.005 * i, i, "default") for i in range(20)]
    thresholds = Thresholds({"default": 0.02})
    (html,) = export_review(pages, tmp_path / "review", thresholds, ReviewConfig(per_domain=12, batch_size=12))
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver = chromium_driver(tmp_path / "profile", downloads)
    try:
        driver.get(html.resolve().as_uri())
        data = json.loads(driver.find_element(By.ID, "review-data").get_attribute("textContent"))
        assert len(data["items"]) == 12
        expected = {}
        for i, item in enumerate(data["items"]):
            label = "accept" if item["delta_h_nats"] >= true_t else "reject"
            expected[item["page_id"]] = label
            driver.find_element(By.ID, f"{label}-{i}").click()
            card = driver.find_element(By.ID, f"item-{i}")
            assert label in card.get_attribute("class").split()
            assert card.find_element(By.CLASS_NAME, "status").text == label
        assert driver.find_element(By.ID, "progress").text == "12 / 12 decided"
        assert {"accept", "reject"} == set(expected.values())
        driver.find_element(By.ID, "save").click()
        target = downloads / "decisions-batch-000.json"
        deadline = time.monotonic() + 15
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert target.exists(), f"no download; got {list(downloads.iterdir())}"
    finally:
        driver.quit()

    saved = json.loads(target.read_text())
    assert {d["page_id"]: d["decision"] for d in saved["decisions"]} == expected

    parser = argparse.ArgumentParser(prog="scifolio")
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "thresholds.json"
    args = parser.parse_args(["review", "fit", str(target), "--out", str(out)])
    assert args.func(args) == 0
    fitted = Thresholds.load(out)
    accepted = [d["delta_h_nats"] for d in saved["decisions"] if d["decision"] == "accept"]
    rejected = [d["delta_h_nats"] for d in saved["decisions"] if d["decision"] == "reject"]
    assert max(rejected) < fitted.threshold_for("default") <= min(accepted)
    assert fitted.fit["default"]["agreement"] == 1.0
