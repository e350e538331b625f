"""The REST API's request and response bodies, shared by the server and the SDK."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, computed_field

from tidal.spec import MAX_PRIORITY
from tidal.spec_fields import MAX_WORKERS, text_problem

__all__ = [
    "AllocationView",
    "EventView",
    "HealthView",
    "JobDetail",
    "JobProgress",
    "JobView",
    "LoginLinkView",
    "MetricsReport",
    "MetricsView",
    "PriorityRequest",
    "RequestBody",
    "RequestView",
    "ScaleByRequest",
    "ScaleRequest",
    "SpecCheck",
    "SpecProblem",
    "SpecWarning",
    "StopWorkersRequest",
    "Submitted",
    "WorkerCountView",
    "WorkerView",
]


class RequestBody(BaseModel):
    """The base of every request body the API reads: a field it does not know is refused."""

    model_config = ConfigDict(extra="forbid")


#: Training steps: exact in JSON readers (the dashboard's charts) and in the store.
MAX_STEP = 2**53 - 1
#: A scale-out's deadline: a year is far more than any rescale may take.
MAX_TIMEOUT_S = 365 * 24 * 3600.0


def _metric_name(value: str) -> str:
    problem = text_problem(value, single_line=True)
    if problem is not None:
        raise ValueError(problem)
    return value


_MetricName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_metric_name)]


class PriorityRequest(RequestBody):
    """Set a job's priority (higher is more important)."""

    priority: int = Field(ge=1, le=MAX_PRIORITY)


class ScaleRequest(RequestBody):
    """Ask for exactly ``workers`` workers (within the job's ``[min, max]``); with
    ``role``, ``workers`` counts that role's replicas (the job's elastic role) and the
    fixed roles keep theirs."""

    workers: int = Field(ge=1, le=MAX_WORKERS)
    role: str | None = Field(default=None, min_length=1, max_length=200)


class ScaleByRequest(RequestBody):
    """Grow or shrink by ``count`` workers; a scale-out with ``timeout_s`` is rolled back
    if the job has not reached its new size by then."""

    count: int = Field(ge=1, le=MAX_WORKERS)
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)


class StopWorkersRequest(RequestBody):
    """Stop these workers of the job (their worker ids) for good; the job goes on without
    them (:mod:`tidal.controller.loop.worker_stops`)."""

    workers: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        min_length=1, max_length=MAX_WORKERS
    )


class MetricsReport(RequestBody):
    """Training metrics of one step, e.g. ``{"step": 120, "values": {"loss": 0.31}}``."""

    step: int = Field(ge=0, le=MAX_STEP)
    values: dict[_MetricName, float] = Field(min_length=1, max_length=1000)


class MetricsView(BaseModel):
    """Metrics a job reported at one step."""

    step: int
    time: float
    values: dict[str, float]


class WorkerView(BaseModel):
    """One worker of a job."""

    worker_id: int
    host: str
    slot: int
    pid: int | None
    state: str
    exit_code: int | None
    #: The IP address of the worker's host, where the server knows it.
    ip_address: str | None = None
    #: The role it is a replica of, and its index there (``None``: not known).
    role: str = "worker"
    index: int | None = None
    #: Every slot index it holds on ``host`` (``slot`` first); a replica given several
    #: GPUs holds several.
    slots: list[int] = []


class RoleStatusView(BaseModel):
    """One role's replicas: wanted now, active, succeeded (exited 0), failed."""

    name: str
    replicas: int
    active: int
    succeeded: int
    failed: int


class ConditionView(BaseModel):
    """A Kubeflow-style condition (Created, Running, Restarting, Suspended, Succeeded,
    Failed); ``status`` ``"True"`` for the one the job is in now, and for Created."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_time: float


class WorkerCountView(BaseModel):
    """A job's size counted in workers (processes), as users count them. The job's
    ``*_slots`` fields count slots: a worker given 2 GPUs holds 2 (``slots_per_worker``).
    A job of several roles counts every fixed replica plus its elastic role's workers."""

    now: int
    min: int
    max: int
    target: int | None
    #: Slots each worker of the job's scaling role holds (its GPUs; 1 without GPUs).
    slots_per_worker: int = 1


class RequestView(BaseModel):
    """A request made of a job (``priority``, ``resize``, ``cancel``) that the controller
    has not applied yet; it does on its next tick."""

    id: int
    time: float
    kind: str
    data: dict[str, Any]


#: Marks a response field deprecated in the OpenAPI schema, without a warning at each use.
_DEPRECATED: dict[str, Any] = {"deprecated": True}


class JobView(BaseModel):
    """A job as the API shows it.

    ``priority``, ``target_slots``, ``scale_deadline`` and ``cancel_requested`` show what
    was last asked for, including requests still pending (listed in ``pending_requests``).
    ``min_slots``, ``max_slots`` and ``target_slots`` count slots (a worker given several
    GPUs holds as many); ``min_workers``, ``max_workers`` and ``target_workers`` are the
    same values under their former names, deprecated: they go in the next release.
    """

    id: str
    name: str
    state: str
    reason: str
    priority: int
    workers: int
    # Read under the former names too: a client of this release reads an older server.
    min_slots: int = Field(validation_alias=AliasChoices("min_slots", "min_workers"))
    max_slots: int = Field(validation_alias=AliasChoices("max_slots", "max_workers"))
    target_slots: int | None = Field(
        validation_alias=AliasChoices("target_slots", "target_workers")
    )
    slots: list[tuple[str, int]]
    restarts: int
    #: How many times the job's allocation changed (started, resized, worker replaced).
    reallocations: int = 0
    #: The same count under its former name, kept for clients that read it.
    generation: int = 0
    labels: dict[str, str]
    target_group: str | None
    cancel_requested: bool
    scale_deadline: float | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    #: The job's spec as submitted; ``None`` in the listing's summary view.
    spec: dict[str, Any] | None = None
    owner: str = "admin"
    team: str = "default"
    pending_requests: list[RequestView] = Field(default_factory=list)
    #: From the job's newest goodput report (jobs using the adaptive batch size): the
    #: global batch it trains at, its statistical efficiency there (progress per sample
    #: relative to the initial batch, in (0, 1]) and its predicted speed-up over one
    #: worker at the initial batch. ``None`` until the job reports.
    batch_size: int | None = None
    efficiency: float | None = None
    speedup: float | None = None
    #: The size in workers (``None`` from a server that does not tell it).
    worker_counts: WorkerCountView | None = None

    @computed_field(description="Deprecated: min_slots.", json_schema_extra=_DEPRECATED)  # type: ignore[prop-decorator]
    @property
    def min_workers(self) -> int:
        """``min_slots`` under its former name (deprecated)."""
        return self.min_slots

    @computed_field(description="Deprecated: max_slots.", json_schema_extra=_DEPRECATED)  # type: ignore[prop-decorator]
    @property
    def max_workers(self) -> int:
        """``max_slots`` under its former name (deprecated)."""
        return self.max_slots

    @computed_field(description="Deprecated: target_slots.", json_schema_extra=_DEPRECATED)  # type: ignore[prop-decorator]
    @property
    def target_workers(self) -> int | None:
        """``target_slots`` under its former name (deprecated)."""
        return self.target_slots


class JobDetail(JobView):
    """A job with its workers and its spec."""

    spec: dict[str, Any]
    worker_list: list[WorkerView] = Field(default_factory=list)
    #: The newest goodput report as sent (fitted throughput model, noise scale, ...).
    goodput: dict[str, Any] | None = None
    #: Replicas per role, in the spec's order.
    roles: list[RoleStatusView] = Field(default_factory=list)
    conditions: list[ConditionView] = Field(default_factory=list)


class EventView(BaseModel):
    """Something that happened to a job (or to the controller, when ``job_id`` is null)."""

    id: int
    job_id: str | None
    time: float
    kind: str
    message: str
    data: dict[str, Any]
    #: The user who made the change (null: the server) and through what (``cli``,
    #: ``api``, ``dashboard``).
    actor: str | None = None
    source: str | None = None


class AllocationView(BaseModel):
    """From ``time`` on, ``job_id`` held ``count`` slots."""

    job_id: str
    time: float
    count: int
    slots: list[tuple[str, int]]


class HealthView(BaseModel):
    """Liveness."""

    status: str
    version: str


class SpecProblem(BaseModel):
    """One problem of a spec: ``path`` is the field's dotted path (``workers.min``; empty
    for the spec as a whole) and ``line`` the 1-based line of YAML text it names, if any."""

    loc: list[str | int]
    path: str
    msg: str
    line: int | None = None


class SpecWarning(BaseModel):
    """A field of a submitted manifest that tidal read but cannot honour (``path`` is the
    manifest's field path, ``spec.tfReplicaSpecs.Worker.template.spec.containers[0].image``)."""

    path: str
    msg: str


class Submitted(JobView):
    """A job just submitted, with the warnings of its manifest's translation (if any)."""

    warnings: list[SpecWarning] = Field(default_factory=list)


class SpecCheck(BaseModel):
    """A spec checked without submitting it."""

    valid: bool
    problems: list[SpecProblem]
    #: A manifest's fields that would not be honoured.
    warnings: list[SpecWarning] = Field(default_factory=list)


class JobProgress(BaseModel):
    """A job's latest reported training metrics (e.g. a ``progress`` value in [0, 1])."""

    job_id: str
    step: int
    time: float
    values: dict[str, float]


class LoginLinkView(BaseModel):
    """A one-time login link to the dashboard: good for one use, until ``expires_at``."""

    url: str
    expires_at: float
