"""The store's users, tokens and sessions (SQLite and PostgreSQL), and the pure decisions
of who may do what."""

from __future__ import annotations

import pytest

from tidal.controller.access import (
    Principal,
    Role,
    admin_refusal,
    change_refusal,
    priority_refusal,
    read_refusal,
    submit_refusal,
    team_refusal,
    token_refusal,
)
from tidal.controller.credentials import ServerKey
from tidal.controller.store.accounts import USE_RESOLUTION_S, AccountError
from tidal.controller.store.jobs import JobStore

KEY = ServerKey(b"k" * 32)


def test_tokens_identify_their_user_until_revoked_or_expired(db_url: str) -> None:
    store = JobStore(db_url)
    try:
        assert [u.name for u in store.users()] == ["admin"]
        store.add_user("ana", "member", "vision", now=1.0)
        store.add_token("ana", "laptop", KEY.digest("secret-a"), now=1.0)
        store.add_token("ana", "ci", KEY.digest("secret-b"), expires_at=100.0, now=1.0)
        found = store.identify_token(KEY.digest("secret-a"), now=50.0)
        assert found is not None and (found.user.name, found.user.team) == ("ana", "vision")
        assert store.identify_token(KEY.digest("secret-b"), now=99.0) is not None
        assert store.identify_token(KEY.digest("secret-b"), now=100.0) is None  # expired
        assert store.identify_token(KEY.digest("guess"), now=50.0) is None
        with pytest.raises(AccountError, match="has a token named 'laptop' already"):
            store.add_token("ana", "laptop", KEY.digest("other"), now=2.0)

        token = found.token_id
        store.add_session(KEY.digest("session-1"), token, expires_at=80.0, now=50.0)
        store.add_session(KEY.digest("session-2"), token, expires_at=80.0, now=50.0)
        assert store.identify_session(KEY.digest("session-1"), now=60.0) is not None
        assert store.identify_session(KEY.digest("session-1"), now=80.0) is None  # ended
        assert store.end_session(KEY.digest("session-1"), now=61.0)
        assert store.identify_session(KEY.digest("session-1"), now=62.0) is None
        assert store.identify_session(KEY.digest("session-2"), now=62.0) is not None

        store.revoke_token("ana", "laptop", now=70.0)
        assert store.identify_token(KEY.digest("secret-a"), now=71.0) is None
        # Its sessions end with it.
        assert store.identify_session(KEY.digest("session-2"), now=71.0) is None
        assert store.has_token(KEY.digest("secret-a"))  # remembered, so never registered again
        with pytest.raises(AccountError, match="no live token"):
            store.revoke_token("ana", "laptop", now=72.0)
        # The name is free again once revoked.
        store.add_token("ana", "laptop", KEY.digest("secret-c"), now=73.0)

        store.remove_user("ana")
        assert store.identify_token(KEY.digest("secret-c"), now=74.0) is None
        assert store.tokens("ana") == []
        with pytest.raises(AccountError, match="last admin"):
            store.remove_user("admin")
    finally:
        store.close()


def test_a_tokens_last_use_is_kept_to_the_minute(db_url: str) -> None:
    store = JobStore(db_url)
    try:
        store.add_user("ana", "member", "vision", now=1.0)
        used = store.add_token("ana", "laptop", KEY.digest("a"), now=1.0)
        store.add_token("ana", "phone", KEY.digest("b"), now=1.0)
        assert [t.last_used_at for t in store.tokens("ana")] == [None, None]
        assert store.note_token_use(used.id, now=100.0)
        # Within the minute: not written again (a busy client costs one write a minute).
        assert not store.note_token_use(used.id, now=100.0 + USE_RESOLUTION_S - 1)
        assert [t.last_used_at for t in store.tokens("ana")] == [100.0, None]
        assert store.note_token_use(used.id, now=100.0 + USE_RESOLUTION_S)
        assert [t.last_used_at for t in store.tokens("ana")] == [100.0 + USE_RESOLUTION_S, None]
        # An earlier time never replaces a later one.
        assert not store.note_token_use(used.id, now=50.0)
    finally:
        store.close()


def test_a_users_role_and_team_change_and_the_last_admin_keeps_the_role(db_url: str) -> None:
    store = JobStore(db_url)
    try:
        store.add_user("ana", "member", "vision", now=1.0)
        store.add_token("ana", "laptop", KEY.digest("secret-a"), now=1.0)
        before, after = store.set_user("ana", role="viewer", team="nlp")
        assert (before.role, before.team, after.role, after.team) == (
            "member",
            "vision",
            "viewer",
            "nlp",
        )
        found = store.identify_token(KEY.digest("secret-a"), now=2.0)
        assert found is not None and (found.user.role, found.user.team) == ("viewer", "nlp")
        with pytest.raises(AccountError, match=r"^role: 'admin' is the last admin"):
            store.set_user("admin", role="member")
        with pytest.raises(AccountError, match=r"^no user 'bob'"):
            store.set_user("bob", role="member")
        # The last admin may change team, and step down once another admin exists.
        assert store.set_user("admin", team="ops")[1].role == "admin"
        store.set_user("ana", role="admin")
        assert store.set_user("admin", role="member")[1].role == "member"
        assert [u.name for u in store.users() if u.role == "admin"] == ["ana"]
    finally:
        store.close()


def test_the_store_holds_keyed_hashes_that_depend_on_the_key() -> None:
    other = ServerKey(b"o" * 32)
    assert KEY.digest("t") != other.digest("t")
    assert len(KEY.digest("t")) == 64 and "t" not in repr(KEY)
    with pytest.raises(ValueError, match="32 bytes"):
        ServerKey(b"short")


def _who(role: Role, team: str = "vision") -> Principal:
    return Principal(user="u", role=role, team=team, token_id=1)


@pytest.mark.parametrize(
    ("role", "team", "allowed"),
    [
        (Role.ADMIN, "nlp", True),
        (Role.MEMBER, "vision", True),
        (Role.MEMBER, "nlp", False),
        (Role.VIEWER, "vision", False),
    ],
)
def test_who_may_change_a_job_of_team_vision(role: Role, team: str, allowed: bool) -> None:
    refusal = change_refusal(_who(role, team), "vision")
    assert (refusal is None) is allowed
    if refusal is not None:
        assert "'u'" in refusal


def test_reads_submissions_administration_and_priorities() -> None:
    assert read_refusal(_who(Role.VIEWER), "vision") is None
    assert read_refusal(_who(Role.MEMBER, "nlp"), "vision") is not None
    assert read_refusal(_who(Role.ADMIN, "nlp"), "vision") is None
    assert submit_refusal(_who(Role.MEMBER)) is None
    assert submit_refusal(_who(Role.VIEWER)) is not None
    assert admin_refusal(_who(Role.MEMBER)) is not None
    assert admin_refusal(_who(Role.ADMIN)) is None
    assert priority_refusal(_who(Role.MEMBER), 10_000) is None
    assert priority_refusal(_who(Role.MEMBER), 10_001) is not None
    assert priority_refusal(_who(Role.ADMIN), 1_000_000) is None


def test_every_user_manages_their_own_tokens_and_admins_anyones() -> None:
    for role in Role:
        assert token_refusal(_who(role), "u") is None
    assert token_refusal(_who(Role.ADMIN), "ana") is None
    for role in (Role.MEMBER, Role.VIEWER):
        refusal = token_refusal(_who(role), "ana")
        assert refusal is not None and "'u' may manage only their own tokens" in refusal


def test_a_user_joins_a_team_of_the_teams_file_or_any_without_one() -> None:
    known = frozenset({"default", "vision"})
    assert team_refusal("anything", None) is None
    assert team_refusal("vision", known) is None
    refusal = team_refusal("visoin", known)
    assert refusal is not None and "'visoin'" in refusal and "default, vision" in refusal
