"""Headless Chromium loads the search page served by uvicorn on 127.0.0.1, runs a text query, sees thumbnails."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from retrieval.index import ShardedIndex
from retrieval.search import load_searcher
from retrieval.service import ServeConfig, create_app
from tests.browser import HAVE_CHROMIUM, NO_CHROMIUM, chromium_driver

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(ready_index, tiny_models):
    import uvicorn

    s = load_searcher(ShardedIndex(ready_index["config"]), tiny_models["retrieval-clip"])
    with socket.socket() as sock:  # a free loopback port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(s, ServeConfig(port=port, shards=str(ready_index["out"])))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 30
    while not srv.started:
        if time.time() > deadline or not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(timeout=10)
    s.index.close()


@pytest.mark.skipif(not HAVE_CHROMIUM, reason=NO_CHROMIUM)
def test_page_text_query_shows_thumbnails(server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium_driver(tmp_path / "profile")
    try:
        driver.get(server + "/")
        box = driver.find_element(By.ID, "query")
        box.send_keys("a yellow circle")
        driver.find_element(By.ID, "k").clear()
        driver.find_element(By.ID, "k").send_keys("6")
        driver.find_element(By.ID, "search-btn").click()
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#grid .result")) == 6)
        # Every thumbnail actually loaded (decoded with a real size), not just an <img> tag.
        wait.until(
            lambda d: d.execute_script(
                "const im = [...document.querySelectorAll('#grid img.thumb')];"
                "return im.length === 6 && im.every(i => i.complete && i.naturalWidth > 0);"
            )
        )
        cards = driver.find_elements(By.CSS_SELECTOR, "#grid .result")
        assert all("score" in c.text and "page" in c.text for c in cards)
        assert driver.find_element(By.ID, "status").text.startswith("6 results")
    finally:
        driver.quit()
