"""``tidal user``, ``tidal token``, ``tidal login`` and ``tidal events --actor`` against a
real server: an admin adds a member and gives them a token, the member logs in with it
(stored 0600 in their config) and works through it, the audit trail names them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.controller.conftest import Served
from tidal.cli.main import controller_app, run_app
from tidal.wire.discovery import read_login


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_app(controller_app, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_admin_gives_a_member_a_token_and_the_member_works_through_it(
    served: Served,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = ("--url", served.url, "--token", served.token)
    code, out, err = run(capsys, "user", "add", "ana", "--team", "vision", *admin)
    assert (code, err) == (0, ""), err
    assert "added ana (member, team vision)" in out
    code, out, _ = run(capsys, "user", "list", *admin)
    assert code == 0
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [
        ["admin", "admin", "default"],
        ["ana", "member", "vision"],
    ]
    code, out, _ = run(capsys, "token", "create", "laptop", "--user", "ana", "--json", *admin)
    assert code == 0
    token = json.loads(out)["token"]
    code, out, _ = run(capsys, "token", "list", *admin)
    assert code == 0
    assert token not in out
    assert "ana" in out and "laptop" in out and "live" in out
    assert all(len(line) <= 80 for line in out.splitlines())

    # The member's machine: no data dir with a server beside it, only their config.
    config = tmp_path / "config" / "tidal.json"
    monkeypatch.setenv("TIDAL_CONFIG", str(config))
    monkeypatch.setenv("TIDAL_DATA_DIR", str(tmp_path / "nothing-here"))
    monkeypatch.delenv("TIDAL_URL", raising=False)
    monkeypatch.delenv("TIDAL_TOKEN", raising=False)
    code, out, err = run(capsys, "login", "--url", served.url, "--token", token)
    assert (code, err) == (0, ""), err
    assert "as ana (member, team vision)" in out
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert read_login(config) is not None

    spec = tmp_path / "job.yaml"
    spec.write_text("name: mine\ncommand: python train.py\nworkers: 1:2\n")
    code, out, err = run(capsys, "submit", str(spec))
    assert code == 0, err
    job = next(j for j in served.store.list_jobs() if j.name == "mine")
    assert (job.owner, job.team) == ("ana", "vision")
    # A member may not manage users: a refusal exits 1 naming why.
    code, _, err = run(capsys, "user", "list")
    assert code == 1
    assert "only admins" in err
    # ... but manages their own tokens, and only theirs.
    code, out, err = run(capsys, "token", "create", "phone", "--expires", "30d")
    assert code == 0, err
    assert "token phone of ana, valid until" in out
    code, out, _ = run(capsys, "token", "list")
    assert code == 0
    rows = out.splitlines()[1:]
    assert [line.split()[:2] for line in rows] == [["ana", "laptop"], ["ana", "phone"]]
    # The token she works through shows when it was last used; the new one, never.
    assert "never" not in rows[0] and "never" in rows[1]
    assert all(len(line) <= 80 for line in out.splitlines())
    code, out, err = run(capsys, "token", "revoke", "phone")
    assert code == 0, err
    assert "revoked ana's token phone" in out
    code, _, err = run(capsys, "token", "list", "--user", "admin")
    assert code == 1
    assert "only their own tokens" in err

    code, out, _ = run(capsys, "events", "--actor", "ana", *admin)
    assert code == 0
    assert "submitted" in out and "ana (cli)" in out
    # An admin changes her role: her next change is refused.
    code, out, err = run(capsys, "user", "set", "ana", "--role", "viewer", *admin)
    assert code == 0, err
    assert "ana is now viewer, team vision" in out
    code, _, err = run(capsys, "submit", str(spec))
    assert code == 1
    assert "viewer" in err
    code, _, err = run(capsys, "user", "set", "ana", "--role", "owner", *admin)
    assert code == 2
    assert "--role" in err
    code, _, err = run(capsys, "user", "set", "admin", "--role", "member", *admin)
    assert code == 1
    assert "last admin" in err
    # The earlier form, naming the user first, still revokes.
    code, out, _ = run(capsys, "token", "revoke", "ana", "laptop", *admin)
    assert code == 0
    code, _, err = run(capsys, "list")
    assert code == 1
    assert "revoked" in err or "token" in err
