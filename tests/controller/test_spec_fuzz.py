"""Spec fuzzing: generated specs, valid and hostile, are accepted and round-trip, or refused
with every problem naming its field; nothing else is ever raised, and each takes little time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.controller.hostile import CASES, YAML
from tidal.spec import JobSpec, SpecError, parse_spec, parse_spec_json, parse_spec_yaml

#: CPU seconds per example (a few milliseconds normally): a parse that blows up (a YAML
#: alias bomb, a huge number) takes far longer. CPU time, not wall time, so that other
#: work on a loaded machine does not count against the parser.
BUDGET_S = 2.0

_any_text = st.text(max_size=30)
_safe_text = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=30
)
_numbers = st.one_of(
    st.integers(min_value=-5, max_value=10),
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63), 10**400]),
    st.floats(),
    st.booleans(),
    st.sampled_from(["7", "1:8", "\uff14", "\u0661:\u0668", " 2 : 3 ", "4Gi", "1.5Gi", "x"]),
    st.none(),
)
_name = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,20}", fullmatch=True),
    st.sampled_from(["job\n", "Job", "", "a" * 64, "-a"]),
    _any_text,
    _numbers,
)
_command = st.one_of(
    st.lists(_safe_text, min_size=1, max_size=5),
    st.lists(st.one_of(_any_text, _numbers), max_size=5),
    _safe_text,
    _any_text,
    _numbers,
)
_mapping = st.dictionaries(
    st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), _any_text),
    st.one_of(_safe_text, _any_text, _numbers),
    max_size=4,
)
_workers = st.one_of(
    _numbers,
    st.fixed_dictionaries(
        {}, optional={"min": _numbers, "max": _numbers, "initial": _numbers, "typo": _numbers}
    ),
)
_resources = st.fixed_dictionaries(
    {}, optional={"gpus": _numbers, "cpus": _numbers, "memory": _numbers}
)
_printable = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20)
_count = st.integers(min_value=1, max_value=100_000)
#: Specs meant to be valid (a few are not: min > max, say), in every accepted form.
VALID_SPECS = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,62}", fullmatch=True),
        "command": st.one_of(
            st.lists(_safe_text, min_size=1, max_size=5),
            st.from_regex(r"[a-z./]{1,10}( [a-z0-9=-]{1,8}){0,4}", fullmatch=True),
        ),
    },
    optional={
        "workers": st.one_of(
            _count,
            st.tuples(_count, _count).map(lambda t: f"{t[0]}:{t[1]}"),
            st.fixed_dictionaries({}, optional={"min": _count, "max": _count, "initial": _count}),
        ),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "gpus": st.integers(0, 1),
                "cpus": st.floats(min_value=0.01, max_value=4096),
                "memory": st.one_of(
                    st.integers(0, 2**60),
                    st.from_regex(r"[1-9][0-9]{0,3}(\.[0-9]{1,2})?([KMG]i?)", fullmatch=True),
                ),
            },
        ),
        "env": st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), _safe_text),
        "labels": st.dictionaries(_printable.filter(lambda k: len(k) >= 1), _printable),
        "priority": st.integers(1, 1_000_000),
        "restart": st.fixed_dictionaries({}, optional={"max_restarts": st.integers(0, 10**9)}),
        "checkpoint_every_steps": st.integers(0, 10**15),
        "checkpoint_every_seconds": st.floats(min_value=0, max_value=1e9),
        "working_dir": _safe_text,
    },
)
HOSTILE_SPECS = st.fixed_dictionaries(
    {"name": _name, "command": _command},
    optional={
        "workers": _workers,
        "resources": st.one_of(_resources, _numbers),
        "env": st.one_of(_mapping, _numbers),
        "labels": _mapping,
        "priority": _numbers,
        "restart": st.fixed_dictionaries({}, optional={"max_restarts": _numbers}),
        "target": st.fixed_dictionaries({}, optional={"group": _name, "labels": _mapping}),
        "checkpoint_every_steps": _numbers,
        "checkpoint_every_seconds": _numbers,
        "working_dir": st.one_of(_safe_text, _any_text),
        "surprise": _numbers,
        "\u00b2": _numbers,
    },
)
SPECS = st.one_of(VALID_SPECS, HOSTILE_SPECS)


def check_outcome(
    parse: Callable[..., JobSpec], *args: Any, text_level: bool = False
) -> JobSpec | None:
    """Parse; a spec must round-trip and a refusal name fields. Returns the spec, if any."""
    started = time.process_time()
    try:
        spec: JobSpec | None = parse(*args)
    except SpecError as exc:
        assert exc.problems
        for path, message in exc.problems:
            assert message
            # A problem of the document as a whole (syntax, size) has no field to name.
            assert path or text_level or message.startswith("a job spec must be a mapping")
        # Problems are shown and sent as JSON: they must encode.
        json.dumps(exc.problems, ensure_ascii=False).encode("utf-8")
        spec = None
    assert time.process_time() - started < BUDGET_S
    if spec is not None:
        stored = json.dumps(spec.model_dump(mode="json"), allow_nan=False, ensure_ascii=False)
        stored.encode("utf-8")
        assert parse_spec(json.loads(stored)) == spec
        assert parse_spec_json(stored) == spec
        assert parse_spec_yaml(yaml.safe_dump(spec.model_dump(mode="json"))) == spec
        finite = [spec.checkpoint_every_seconds]
        finite += [] if spec.resources.cpus is None else [spec.resources.cpus]
        assert all(math.isfinite(v) for v in finite)
    return spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example({"name": "s", "command": "/bin/\ud800true", "workers": "5:6"})
@example({"name": "a", "command": ["x"], "workers": {"min": 4, "max": True}})
@example({"name": "a", "command": ["x"], "resources": {"memory": "9" * 400}})
@example({"name": "a", "command": ["x"], "resources": {"memory": True, "cpus": float("inf")}})
@example({"name": "a\n", "command": ["x"], "env": {"K\n": "v"}})
@example({"name": "a", "command": ["x"], "workers": 2**63, "\u00b2": 1})
@example({"name": "a", "command": ["x"], "priority": "7", "checkpoint_every_seconds": math.nan})
@example({"name": "a", "command": ["x"], "workers": {}})
@example({"name": "a", "command": ["x"], "workers": {"min": 5, "max": None, "initial": 5}})
@given(SPECS)
def test_generated_specs_are_accepted_whole_or_refused_by_field(data: dict[str, Any]) -> None:
    spec = check_outcome(parse_spec, data)
    workers = data.get("workers")
    if spec is not None and isinstance(workers, dict):
        # Accepted but invalid: a size written empty (read as 1:1) or with a null count.
        assert workers and None not in workers.values(), workers
    # The same data as JSON text reaches the same verdict (and the same spec).
    try:
        text = json.dumps(data)
    except ValueError:  # an integer too long to write out
        return
    from_json = check_outcome(parse_spec_json, text, text_level=True)
    assert (from_json is None) == (spec is None) or len(text) > 60_000
    assert from_json is None or from_json == spec


def _with_examples(test: Any) -> Any:
    for case in CASES:
        test = example(case.body.decode("utf-8", "replace"), case.content_type == YAML)(test)
    return test


_FRAGMENTS = st.sampled_from(
    [
        "name: a\n",
        "command: [x]\n",
        "command: python train.py\n",
        "workers: 1:8\n",
        "workers: {min: 1, max: true}\n",
        "resources: {memory: 4Gi, cpus: .inf}\n",
        "env: &e {A: '1'}\n",
        "labels: *e\n",
        "labels: !!set {a}\n",
        "x: &x [*x]\n",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
        "name: b\n",
        "priority: 0x7fffffffffffffffff\n",
        "? [a]\n: b\n",
        "<<: {name: c}\n",
        "'\ud800': 1\n",
        "- a\n",
        "---\n",
        "%YAML 1.1\n",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@_with_examples
@given(
    st.one_of(st.lists(_FRAGMENTS, max_size=8).map("".join), st.text(max_size=200)),
    st.booleans(),
)
def test_any_text_is_parsed_or_refused_cleanly(text: str, is_yaml: bool) -> None:
    check_outcome(parse_spec_yaml if is_yaml else parse_spec_json, text, text_level=True)
