"""The dashboard's routes without a browser: login, the cookie, the anti-forgery header,
assets served from the package with nothing fetched from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import httpx
import pytest

from tests.dashboard.conftest import Served
from tidal.controller.routes.auth import CSRF_HEADER, SESSION_COOKIE
from tidal.dashboard import STATIC_DIR

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "web", "command": "python train.py", "workers": "1:4"}


def login(served: Served, token: str) -> httpx.Response:
    return httpx.post(f"{served.url}/login", json={"token": token}, timeout=5)


def test_index_sends_a_browser_without_the_cookie_to_the_login_page(served: Served) -> None:
    response = httpx.get(f"{served.url}/", timeout=5)
    assert response.status_code == 303
    assert response.headers["location"] == "/login"
    page = httpx.get(f"{served.url}/login", timeout=5)
    assert page.status_code == 200
    assert 'id="login-form"' in page.text


def test_wrong_token_is_refused_without_a_cookie(served: Served) -> None:
    for token in ["", "nope", served.token + "x"]:
        response = login(served, token)
        assert response.status_code == 401
        assert response.json() == {"detail": "wrong token"}
        assert SESSION_COOKIE not in response.cookies
    form = httpx.post(f"{served.url}/login", data={"token": "nope"}, timeout=5)
    assert form.status_code == 401


def test_login_sets_an_http_only_cookie_that_opens_the_app_and_the_api(served: Served) -> None:
    response = login(served, served.token)
    assert response.status_code == 204
    cookie = response.headers["set-cookie"]
    assert f"{SESSION_COOKIE}=" in cookie
    assert "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()
    session = response.cookies[SESSION_COOKIE]
    # The cookie is a session id, not the token.
    assert served.token not in cookie
    assert session != served.token
    with httpx.Client(base_url=served.url, timeout=5) as browser:
        # The token itself as a cookie admits nothing.
        browser.cookies.set(SESSION_COOKIE, served.token)
        assert browser.get("/jobs").status_code == 401
        browser.cookies.set(SESSION_COOKIE, session)
        index = browser.get("/")
        assert index.status_code == 200
        assert '<main id="view">' in index.text
        assert browser.get("/jobs").status_code == 200
        # A change authenticated by the cookie alone could be forged by another site.
        refused = browser.post("/jobs", json=SPEC)
        assert refused.status_code == 403
        assert served.store.list_jobs() == []
        made = browser.post("/jobs", json=SPEC, headers={CSRF_HEADER: "1"})
        assert made.status_code == 201
        assert browser.get("/me").json()["name"] == "admin"
        browser.cookies.set(SESSION_COOKIE, "wrong")
        assert browser.get("/jobs").status_code == 401


def test_login_form_post_works_without_javascript(served: Served) -> None:
    response = httpx.post(f"{served.url}/login", data={"token": served.token}, timeout=5)
    assert response.status_code == 303
    assert response.headers["location"] == "/"
    assert SESSION_COOKIE in response.cookies


def test_logout_clears_the_cookie(served: Served) -> None:
    response = httpx.post(f"{served.url}/logout", timeout=5)
    assert response.status_code == 204
    assert f'{SESSION_COOKIE}=""' in response.headers["set-cookie"]


def test_logout_ends_the_session_in_the_server(served: Served) -> None:
    session = login(served, served.token).cookies[SESSION_COOKIE]
    with httpx.Client(base_url=served.url, timeout=5) as browser:
        browser.cookies.set(SESSION_COOKIE, session)
        assert browser.get("/jobs").status_code == 200
        assert browser.post("/logout").status_code == 204
    # A copy of the cookie kept from before the logout admits nothing any more.
    with httpx.Client(base_url=served.url, timeout=5) as copy:
        copy.cookies.set(SESSION_COOKIE, session)
        assert copy.get("/jobs").status_code == 401
        assert copy.get("/", follow_redirects=False).status_code == 303


def test_revoking_its_token_ends_the_session(served: Served) -> None:
    admin = {"Authorization": f"Bearer {served.token}"}
    made = httpx.post(f"{served.url}/tokens", json={"name": "laptop"}, headers=admin, timeout=5)
    assert made.status_code == 201
    session = login(served, made.json()["token"]).cookies[SESSION_COOKIE]
    with httpx.Client(base_url=served.url, timeout=5) as browser:
        browser.cookies.set(SESSION_COOKIE, session)
        assert browser.get("/jobs").status_code == 200
        revoked = httpx.post(f"{served.url}/tokens/admin/laptop/revoke", headers=admin, timeout=5)
        assert revoked.status_code == 200
        assert browser.get("/jobs").status_code == 401


def test_assets_are_served_and_nothing_is_fetched_from_elsewhere(served: Served) -> None:
    for path in ["/ui/app.css", "/ui/js/app.js", "/ui/vendor/uplot/uPlot.iife.min.js"]:
        assert httpx.get(f"{served.url}{path}", timeout=5).status_code == 200
    remote = re.compile(
        r"""(src|href)\s*=\s*["']?(https?:)?//|import[^;]*["']https?:|url\(["']?https?:"""
    )
    for file in STATIC_DIR.rglob("*"):
        if file.suffix in {".html", ".js", ".css"} and "vendor" not in file.parts:
            assert not remote.search(file.read_text()), f"{file.name} loads something remote"


def test_vendored_chart_library_is_pinned_with_its_licence() -> None:
    vendor = STATIC_DIR / "vendor" / "uplot"
    version = (vendor / "VERSION").read_text()
    assert "uplot 1.6.32" in version
    assert "(v1.6.32)" in (vendor / "uPlot.iife.min.js").read_text()[:100]
    assert "MIT License" in (vendor / "LICENSE").read_text()


def test_every_static_file_is_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["tidal.dashboard"]
    for file in STATIC_DIR.rglob("*"):
        if file.is_file():
            rel = file.relative_to(STATIC_DIR.parent).as_posix()
            assert any(PurePosixPath(rel).match(p) for p in patterns), (
                f"{rel} would not be installed"
            )
