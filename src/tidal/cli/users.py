"""``tidal user add|list|set|remove``, ``tidal token create|list|revoke``, ``tidal login`` and
``tidal events``: who may use a server, with which tokens, and who did what.

Importing this module registers the verbs; it stays light (``tidal --help``): the SDK
loads inside the verbs.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from tidal.cli.options import (
    ClientOptions,
    call,
    controller_app,
    emit_json,
    fail,
    out,
    parse_duration,
    with_client_options,
)
from tidal.cli.table_style import plain_table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tidal.wire.accounts import TokenView

__all__ = ["token_app", "user_app"]

user_app = typer.Typer(help="Users of the server (admins).", no_args_is_help=True)
token_app = typer.Typer(
    help="Your API tokens (admins: anyone's, with --user).", no_args_is_help=True
)

NameArg = Annotated[str, typer.Argument(help="User name: a-z first, then a-z 0-9 _ . -")]
RoleOpt = Annotated[str, typer.Option(help="admin, member or viewer.")]
ROLES = ("admin", "member", "viewer")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise typer.BadParameter(f"admin, member or viewer (got {role!r})", param_hint="--role")


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


@user_app.command("add")
@with_client_options()
def user_add(
    options: ClientOptions,
    name: NameArg,
    role: RoleOpt = "member",
    team: Annotated[str, typer.Option(help="The team whose jobs a member may change.")] = (
        "default"
    ),
) -> None:
    """Add a user; then give them a token with `tidal token create`."""
    _check_role(role)
    client = options.client()
    user = call(lambda: client.add_user(name, role, team), "name")
    options.show_data(user, f"added {user.name} ({user.role}, team {user.team})")


@user_app.command("list")
@with_client_options()
def user_list(options: ClientOptions) -> None:
    """List the users."""
    client = options.client()
    users = call(client.users)
    if options.as_json:
        emit_json(users)
        return
    table = plain_table("NAME", "ROLE", "TEAM", "ADDED")
    for u in users:
        table.add_row(u.name, u.role, u.team, _when(u.created_at))
    out.print(table)


@user_app.command("set")
@with_client_options()
def user_set(
    options: ClientOptions,
    name: NameArg,
    role: Annotated[str | None, typer.Option(help="The new role: admin, member or viewer.")] = (
        None
    ),
    team: Annotated[str | None, typer.Option(help="The new team.")] = None,
) -> None:
    """Change a user's role or team; their next request is judged by the new ones."""
    if role is None and team is None:
        raise typer.BadParameter("give --role, --team or both", param_hint="--role/--team")
    if role is not None:
        _check_role(role)
    client = options.client()
    user = call(lambda: client.change_user(name, role, team), "role/team")
    options.show_data(user, f"{user.name} is now {user.role}, team {user.team}")


@user_app.command("remove")
@with_client_options()
def user_remove(options: ClientOptions, name: NameArg) -> None:
    """Remove a user and revoke their tokens (their jobs stay)."""
    client = options.client()
    user = call(lambda: client.remove_user(name))
    options.show_data(user, f"removed {user.name}; their tokens are revoked")


@token_app.command("create")
@with_client_options()
def token_create(
    options: ClientOptions,
    name: Annotated[str, typer.Argument(help="The token's name, e.g. laptop or ci.")],
    user: Annotated[str | None, typer.Option(help="Whose (admins).", show_default="yours")] = None,
    expires: Annotated[
        str | None,
        typer.Option(help="Valid for this long (30d, 12h).", show_default="until revoked"),
    ] = None,
) -> None:
    """Create a token. It is shown this once: the server keeps only a hash of it."""
    seconds = None
    if expires is not None:
        try:
            seconds = parse_duration(expires)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--expires") from None
    client = options.client()
    made = call(lambda: client.create_token(name, user, seconds), "name")
    if options.as_json:
        emit_json(made)
        return
    until = "until revoked" if made.expires_at is None else f"until {_when(made.expires_at)}"
    out.print(f"token {made.name} of {made.user}, valid {until}:", markup=False)
    out.print(made.token, markup=False, soft_wrap=True)
    out.print("It is shown only now; keep it safe (`tidal login` stores it).", markup=False)


def _tokens_table(tokens: Sequence[TokenView]) -> Table:
    table = plain_table("USER", "NAME", "CREATED", "EXPIRES", "LAST USED", "STATE")
    for t in tokens:
        state = "revoked" if t.revoked_at is not None else "live"
        used = "never" if t.last_used_at is None else _when(t.last_used_at)
        table.add_row(t.user, t.name, _when(t.created_at), _when(t.expires_at), used, state)
    return table


@token_app.command("list")
@with_client_options()
def token_list(
    options: ClientOptions,
    user: Annotated[str | None, typer.Option(help="Only this user's (admins).")] = None,
) -> None:
    """List your tokens (an admin's: everyone's): names and dates, never the tokens."""
    client = options.client()
    tokens = call(lambda: client.tokens(user))
    if options.as_json:
        emit_json(tokens)
        return
    out.print(_tokens_table(tokens))


@token_app.command("revoke")
@with_client_options()
def token_revoke(
    options: ClientOptions,
    name: Annotated[str, typer.Argument(help="The token's name.")],
    former: Annotated[
        str | None,
        typer.Argument(help="Deprecated form `revoke USER NAME`: the token's name.", hidden=True),
    ] = None,
    user: Annotated[str | None, typer.Option(help="Whose (admins).", show_default="yours")] = None,
) -> None:
    """Revoke a token; the dashboard sessions opened with it end too."""
    if former is not None:
        # The earlier form named the user first: `tidal token revoke ana laptop`.
        if user is not None:
            raise typer.BadParameter("give the user once: --user or `revoke USER NAME`")
        user, name = name, former
    client = options.client()
    owner = user if user is not None else call(client.me).name
    revoked = call(lambda: client.revoke_token(owner, name))
    options.show_data(revoked, f"revoked {revoked.user}'s token {revoked.name}")


@controller_app.command()
def login(
    url: Annotated[str, typer.Option("--url", envvar="TIDAL_URL", help="The server's URL.")],
    token: Annotated[
        str | None, typer.Option("--token", envvar="TIDAL_TOKEN", help="Your token.")
    ] = None,
) -> None:
    """Store a server's URL and your token in your config (mode 0600).

    Later verbs use them when no server runs beside them (no data dir's server file)."""
    from tidal.client import Client, ClientError
    from tidal.wire.discovery import Login, write_login

    if not token:
        token = typer.prompt("token", hide_input=True).strip()
    try:
        with Client(url=url, token=token, via="cli") as client:
            me = client.me()
    except ClientError as exc:
        fail(f"{url} refused the login: {exc}")
    path = write_login(Login(url=url.rstrip("/"), token=token))
    out.print(f"logged in to {url} as {me.name} ({me.role}, team {me.team}); saved in {path}")


@controller_app.command()
@with_client_options()
def events(
    options: ClientOptions,
    actor: Annotated[str | None, typer.Option(help="Only the changes this user made.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job's events.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, help="The latest N.")] = 100,
) -> None:
    """Events (the audit trail): what changed, who changed it, from where, when."""
    client = options.client()
    found = call(lambda: client.events(job, limit=limit, actor=actor))
    if options.as_json:
        emit_json(found)
        return
    table = plain_table("TIME", "JOB", "KIND", "WHO", "MESSAGE", fold=True)
    for e in found:
        who = "-" if e.actor is None else f"{e.actor} ({e.source or '?'})"
        when = datetime.fromtimestamp(e.time).strftime("%m-%d %H:%M:%S")
        table.add_row(when, e.job_id or "-", e.kind, who, e.message)
    out.print(table)
