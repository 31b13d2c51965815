"""Headless Chromium (Debian's build, driven by Playwright) for tests that use a UI as a person does."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DOCS_SCREENSHOTS = "REVGATE_DOCS_SCREENSHOTS"  # a folder: UI tests save the docs' screenshots there

# Chromium must reach nothing but this machine; these flags were found to work offline.
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


@contextmanager
def browser_page() -> Iterator[Any]:
    """A fresh page in a fresh browser; the browser is closed when the block ends."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "Chromium is missing: `make setup` installs it (Debian package chromium)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def screenshot(page: Any, name: str, folder: Path) -> Path:
    """Save what the page shows as ``name``: in ``folder``, or in the docs' image folder named by
    REVGATE_DOCS_SCREENSHOTS (``REVGATE_DOCS_SCREENSHOTS=docs/img`` retakes the docs' screenshots)."""
    path = Path(os.environ.get(DOCS_SCREENSHOTS) or folder) / name
    page.screenshot(path=str(path))
    return path
