"""Reading back a stored spec: today's strict rules apply to new input only.

A spec an earlier release accepted is in the store for good, even where today's rules
refuse it (``"7"`` or ``true`` for a number, full-width digits, a name or env key ending
in a newline, ``.inf`` stored as infinity). Such a job must still show, be cancelled and
run: :func:`load_stored_spec` validates a stored spec strictly and, only if that fails,
again after reading it the way the earlier rules did (:func:`relax`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tidal.spec import JobSpec
from tidal.spec_fields import MAX_CPUS

__all__ = ["load_stored_spec", "relax"]

#: Where the spec holds a whole number, by section (``None``: the top level).
_COUNTS: dict[str | None, tuple[str, ...]] = {
    None: ("priority", "checkpoint_every_steps"),
    "workers": ("min", "max", "initial"),
    "resources": ("gpus", "memory"),
    "restart": ("max_restarts",),
}


def _number(value: Any) -> Any:
    """A boolean or a string of (any script's) digits as the number earlier rules made of
    it; anything else as it is."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value.strip())  # int() reads full-width and Arabic-Indic digits
    return value


def _workers(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(":")]
        if 1 <= len(parts) <= 2 and all(p.isdecimal() for p in parts):
            return ":".join(str(int(p)) for p in parts)  # ASCII digits for the shorthand
        return value
    if isinstance(value, Mapping):
        return {k: _number(v) for k, v in value.items()}
    return value


def relax(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as earlier, lenient rules read it, in today's terms: numbers given as
    booleans or digit strings become numbers, a name or env keys lose a trailing newline,
    a non-finite ``cpus`` is the most there is and a non-finite checkpoint interval is
    off (what infinity meant)."""
    out = dict(data)
    for key in _COUNTS[None]:
        if key in out:
            out[key] = _number(out[key])
    if "workers" in out:
        out["workers"] = _workers(out["workers"])
    for section in ("resources", "restart"):
        if isinstance(out.get(section), Mapping):
            inner = dict(out[section])
            for key in _COUNTS[section]:
                if key in inner:
                    inner[key] = _number(inner[key])
            if section == "resources" and "cpus" in inner:
                cpus = _number(inner["cpus"])
                if isinstance(cpus, int | float) and not math.isfinite(cpus):
                    cpus = MAX_CPUS
                inner["cpus"] = float(cpus) if isinstance(cpus, int) else cpus
            out[section] = inner
    seconds = _number(out.get("checkpoint_every_seconds"))
    if isinstance(seconds, int | float) and "checkpoint_every_seconds" in out:
        out["checkpoint_every_seconds"] = float(seconds) if math.isfinite(seconds) else 0.0
    if isinstance(out.get("name"), str):
        out["name"] = out["name"].rstrip("\n")
    if isinstance(out.get("env"), Mapping):
        out["env"] = {
            (k.rstrip("\n") if isinstance(k, str) else k): v for k, v in out["env"].items()
        }
    return out


def load_stored_spec(data: Mapping[str, Any]) -> JobSpec:
    """The spec of a stored job: strictly validated, or else read as earlier rules did;
    the strict error is raised when neither reading holds."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as strict:
        try:
            return JobSpec.model_validate(relax(data))
        except ValidationError:
            raise strict from None
