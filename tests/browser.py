"""Headless Debian Chromium driven by Selenium, shared by the browser tests.

Chromium's own network features are switched off (this machine's network is closed); the caller
skips when Debian's chromium + chromium-driver are absent (``HAVE_CHROMIUM``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
HAVE_CHROMIUM = bool(CHROMIUM and CHROMEDRIVER)
NO_CHROMIUM = "needs Debian chromium and chromium-driver"


def chromium_driver(profile: Path, download_dir: Path | None = None):  # type: ignore[no-untyped-def]
    """A headless Chromium WebDriver with a fresh profile; downloads go to ``download_dir`` if given."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(flag)
    if download_dir is not None:
        opts.add_experimental_option(
            "prefs",
            {
                "download.default_directory": str(download_dir),
                "download.prompt_for_download": False,
                "download.directory_upgrade": True,
                "safebrowsing.enabled": False,
            },
        )
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    if download_dir is not None:
        # Some headless builds ignore the download pref; the DevTools call is authoritative.
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)})
    return driver
