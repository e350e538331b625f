"""The models page in a real browser (headless Chromium, Playwright) against a real API
server: a registered model's parameters as a generated form, errors beside their fields
(checked as typed, and the server's refusals), and a Train button that submits the job
with the parameters the script will read from ``TIDAL_PARAMS``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import Served
from tidal.wire.registry import ENV_DATASET, ENV_PARAMS

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"

# As tests/dashboard/test_browser.py: outside CI a missing browser skips, saying why.
if not os.environ.get("CI"):
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing (make test installs it: apt-get install chromium)",
            allow_module_level=True,
        )
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402


@pytest.fixture
def page() -> Iterator[Page]:
    """A fresh headless Chromium page; fails the test on any JavaScript error."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.set_default_timeout(15_000)
            tab = context.new_page()
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            yield tab
            assert errors == [], f"JavaScript errors: {errors}"
        finally:
            browser.close()


def test_a_model_is_trained_from_its_generated_form(
    served: Served, page: Page, tmp_path: Path
) -> None:
    data = tmp_path / "digits"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n")
    with served.client() as client:
        client.register_dataset("digits", str(data))
        client.register_model(
            {
                "name": "mlp",
                "code": str(tmp_path),
                "entry_point": "train.py",
                "dataset": "digits",
                "params": [
                    {"name": "epochs", "type": "int", "default": 3, "min": 1, "max": 100},
                    {"name": "lr", "type": "float", "default": 0.1, "min": 0.0001, "max": 1},
                    {"name": "optimizer", "type": "str", "default": "sgd",
                     "choices": ["sgd", "adam"]},
                    {"name": "shuffle", "type": "bool", "default": True},
                ],
            }
        )  # fmt: skip
    page.goto(f"{served.url}/")
    page.fill("#token", served.token)
    page.click("button[type=submit]")
    expect(page.locator("#jobs-table")).to_be_visible()
    page.click("a[data-nav=models]")
    page.click('#models-table tr[data-model="mlp"] a')
    expect(page.locator("#param-epochs")).to_have_value("3")

    # Checked as typed: the error beside its field, and Train refused in the page.
    page.fill("#param-epochs", "0")
    epochs_error = page.locator('.field-error[data-field="params.epochs"]')
    expect(epochs_error).to_have_text("must be ≥ 1")
    page.fill("#param-lr", "fast")
    expect(page.locator('.field-error[data-field="params.lr"]')).to_have_text("expected a number")
    page.click("#train-submit")
    expect(page.locator("#train-status")).to_contain_text("Fix the fields")
    page.screenshot(path=str(ARTIFACTS / "model-form-errors.png"), full_page=True)
    page.fill("#param-epochs", "12")
    page.fill("#param-lr", "0.5")
    expect(epochs_error).to_have_text("")

    # The server's refusal lands beside the field it names.
    page.fill("#train-dataset", "imagenet")
    page.click("#train-submit")
    expect(page.locator('.field-error[data-field="dataset"]')).to_contain_text(
        "no dataset imagenet"
    )
    assert served.store.list_jobs() == []

    page.fill("#train-dataset", "digits:1")
    page.select_option("#param-optimizer", "adam")
    page.uncheck("#param-shuffle")
    page.fill("#train-workers", "1:2")
    page.click("#train-submit")
    expect(page).to_have_url(re.compile(r"#/jobs/mlp-[0-9a-f]{6}$"))
    (job,) = served.store.list_jobs()
    assert json.loads(job.spec.env[ENV_PARAMS]) == {
        "epochs": 12,
        "lr": 0.5,
        "optimizer": "adam",
        "shuffle": False,
    }
    assert job.spec.env[ENV_DATASET] == str(data)
    assert (job.min_slots, job.max_slots) == (1, 2)
