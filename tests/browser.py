"""Open report pages in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium).

Nothing may reach the network: Selenium Manager is bypassed by naming the driver, and Chromium's
background services are switched off. Tests that need the browser skip with a reason when it is not
installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("STEPCLI_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("STEPCLI_CHROMEDRIVER", "/usr/bin/chromedriver")
# Read at import: conftest clears STEPCLI_* variables around each test so runs don't inherit a
# config.
ARTIFACTS = os.environ.get("STEPCLI_ARTIFACTS")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1100,900",
)


def skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not found: apt-get install -y chromium chromium-driver"
    return None


def artifacts_dir(fallback: Path) -> Path:
    """Where screenshots go: $STEPCLI_ARTIFACTS (kept by CI), else the test's temporary folder."""
    folder = Path(ARTIFACTS or fallback)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="stepcli-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
