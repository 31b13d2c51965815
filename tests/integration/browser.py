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


def answer_the_resume_form(page: Any, approver: str, approve: bool, comment: str, before_submit: Any = None) -> None:
    """On a run page whose Resume form is open: name the approver, set approve, write the comment, submit,
    and wait until the form closes (the server took the answer). ``before_submit(form)`` runs just before
    the first Submit (a screenshot, a read of the filled-in digest).

    The form can draw its fields before it has set their initial values, and a value typed in between is
    lost; the form then stays open with nothing sent, or the server refuses the answer (the form shows no
    reason). So every typed value is read back before Submit, and a form still open after a while is
    filled in and submitted again, what the page said printed for the log. A second submit is safe: the
    server takes one answer per pause, and the flow counts each answer it takes on its own.
    """
    from playwright.sync_api import expect

    form = page.locator(".p-modal")
    for attempt in range(1, SUBMIT_ATTEMPTS + 1):
        fill_the_resume_form(form, approver, approve, comment)
        if attempt == 1 and before_submit is not None:
            before_submit(form)
        form.get_by_role("button", name="Submit").click()
        try:  # the form closes once the server took the answer; on two busy cores that took over 30 s once
            expect(form).to_be_hidden(timeout=60_000)
            return
        except AssertionError:
            if attempt == SUBMIT_ATTEMPTS:
                raise
            toasts = page.locator(".p-toast").all_inner_texts()
            print(f"resume form still open after submit {attempt} (page says {toasts!r}): submitting again")


SUBMIT_ATTEMPTS = 3


def fill_the_resume_form(form: Any, approver: str, approve: bool, comment: str) -> None:
    """Type the answer into the open Resume form and read every value back."""
    from playwright.sync_api import expect

    # The fields in the form's order: approver, approve, evidence digest (filled in), comment.
    fields = form.locator("textarea")
    fields.nth(0).fill(approver, timeout=30_000)
    switch = form.get_by_role("switch")
    if switch.is_checked() != approve:
        switch.click()
    fields.nth(2).fill(comment, timeout=30_000)
    expect(fields.nth(0)).to_have_value(approver)
    expect(fields.nth(2)).to_have_value(comment)
    expect(switch).to_be_checked(checked=approve)
