"""The teams file of ``tidal server --teams``: each team's weight, quota and limits.

.. code-block:: yaml

    teams:
      - name: vision
        weight: 2
        guaranteed: 4            # slots for jobs without a resource group
        borrowing_limit: 4       # most slots above the guarantee (optional)
        hard_limit: 8            # most slots in all (optional)
        reclaim: shrink          # its loans taken back by shrinking (default) or evict
      - name: speech
        guaranteed: {a100: 2}    # per resource group

Validated whole at start: a refused file names the field at fault and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tidal.documents import load_yaml
from tidal.documents_bounds import SPEC_LIMITS, DocumentError
from tidal.policy.teams import Team

__all__ = ["TeamsFileError", "load_teams", "parse_teams"]

Slots = Annotated[int, Field(ge=0, strict=True)]


class TeamsFileError(ValueError):
    """A teams file that cannot be read or is not valid."""


class _TeamEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9][\w.-]*$")]
    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    guaranteed: int | dict[str, int] = 0
    borrowing_limit: Slots | None = None
    hard_limit: Slots | None = None
    reclaim: Literal["shrink", "evict"] = "shrink"

    @field_validator("guaranteed", mode="before")
    @classmethod
    def _slots_or_groups(cls, value: object) -> object:
        """A count of slots, or resource group to slots: one message for either form."""

        def count(n: object) -> bool:
            return isinstance(n, int) and not isinstance(n, bool) and n >= 0

        if count(value):
            return value
        if isinstance(value, dict) and all(
            isinstance(k, str) and k and count(n) for k, n in value.items()
        ):
            return value
        raise ValueError(
            f"expected a number of slots (≥ 0) or a mapping of resource group to slots, "
            f"got {value!r}"
        )

    def team(self) -> Team:
        """The policy's plain data for this entry."""
        guaranteed: dict[str | None, int] = (
            {None: self.guaranteed}
            if isinstance(self.guaranteed, int)
            else dict(self.guaranteed.items())
        )
        return Team(
            name=self.name,
            weight=self.weight,
            guaranteed=guaranteed,
            borrowing_limit=self.borrowing_limit,
            hard_limit=self.hard_limit,
            reclaim=self.reclaim,
        )


class _TeamsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teams: Annotated[list[_TeamEntry], Field(min_length=1)]


def parse_teams(data: object, source: str = "teams file") -> list[Team]:
    """The teams ``data`` (a loaded YAML document) defines; :class:`TeamsFileError`
    naming each field at fault otherwise."""
    try:
        parsed = _TeamsFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{_path(err['loc'])}: {err['msg']}" for err in exc.errors())
        raise TeamsFileError(f"{source}: {problems}") from None
    names = [t.name for t in parsed.teams]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise TeamsFileError(f"{source}: teams[{i}].name: team {name!r} is defined twice")
    return [entry.team() for entry in parsed.teams]


def _path(loc: tuple[int | str, ...]) -> str:
    """A field's path as a user writes it: ``teams[0].guaranteed``."""
    text = ""
    for key in loc:
        text += f"[{key}]" if isinstance(key, int) else f".{key}" if text else str(key)
    return text or "file"


def load_teams(path: Path) -> list[Team]:
    """The teams defined in the YAML file at ``path``."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TeamsFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = load_yaml(text, SPEC_LIMITS)
    except DocumentError as exc:
        raise TeamsFileError(f"{path}: {exc}") from None
    return parse_teams(data, str(path))
