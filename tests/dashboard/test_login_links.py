"""One-time login links without a browser: the store of nonces, and the routes over a real
server (``GET /login/link``, ``POST /login/links``)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.dashboard.conftest import Served
from tidal.controller.routes.auth import SESSION_COOKIE
from tidal.controller.store.accounts import Identity, UserRecord
from tidal.dashboard.login_links import LINK_PATH, REFUSED_PATH, LoginLinks


def _nonce(url: str) -> str:
    return parse_qs(urlsplit(url).query)["nonce"][0]


#: Whom the links made in these tests log in: a member's token.
GRANT = Identity(
    user=UserRecord(name="ana", role="member", team="vision", created_at=0.0),
    token_id=7,
    expires_at=None,
)


def test_a_link_works_once_and_only_until_it_expires() -> None:
    now = [1000.0]
    links = LoginLinks(ttl_s=300, clock=lambda: now[0])
    first = links.make("http://127.0.0.1:8/", GRANT)
    assert first.url.startswith(f"http://127.0.0.1:8{LINK_PATH}?nonce=")
    assert first.expires_at == 1300.0
    assert links.use(_nonce(first.url)) == GRANT, "it logs in as whoever made it"
    assert links.use(_nonce(first.url)) is None, "a second use is refused"

    late = links.make("http://127.0.0.1:8", GRANT)
    now[0] = 1300.0
    assert links.use(_nonce(late.url)) is None, "an expired link is refused"
    assert links.use("") is None, "no nonce, no login"
    assert links.use("made-up") is None


def test_past_the_most_links_kept_the_oldest_is_dropped() -> None:
    links = LoginLinks(max_open=2)
    oldest, middle, newest = (links.make("http://h", GRANT) for _ in range(3))
    assert links.use(_nonce(oldest.url)) is None
    assert links.use(_nonce(middle.url)) and links.use(_nonce(newest.url))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        LoginLinks(ttl_s=0)


def test_the_routes_make_a_link_with_the_token_and_log_in_with_it_once(served: Served) -> None:
    with httpx.Client(base_url=served.url, follow_redirects=False, timeout=10) as http:
        assert http.post("/login/links").status_code == 401, "making a link needs the token"
        made = http.post("/login/links", headers={"Authorization": f"Bearer {served.token}"})
        assert made.status_code == 201
        url = made.json()["url"]
        assert url.startswith(f"{served.url}{LINK_PATH}?nonce=")
        assert served.token not in url

        opened = http.get(url)
        assert opened.status_code == 303
        assert opened.headers["location"] == "/", "the redirect drops the nonce"
        session = opened.cookies[SESSION_COOKIE]
        assert session and session != served.token, "the cookie holds a session, not the token"
        assert http.get("/").status_code == 200, "the cookie kept logs the browser in"
        assert http.get("/me").json()["name"] == "admin", "as the user who made the link"

        again = http.get(url)
        assert again.status_code == 303
        assert again.headers["location"] == REFUSED_PATH
        assert SESSION_COOKIE not in again.cookies


def test_the_sdk_makes_a_link(served: Served) -> None:
    with served.client() as client:
        link = client.login_link()
    assert link.url.startswith(f"{served.url}{LINK_PATH}?nonce=")
    with httpx.Client(follow_redirects=False, timeout=10) as http:
        assert http.get(link.url).headers["location"] == "/"
