"""The report channel: the store queue, the buffering reporter, the launcher's reading."""

from __future__ import annotations

import json
import time

import pytest

from tidal.runtime import report as report_module
from tidal.runtime.rendezvous import RendezvousHost, ReportQueue, connect_store
from tidal.runtime.report import REPORT_PREFIX, Reporter


@pytest.fixture
def host() -> RendezvousHost:
    return RendezvousHost()


def test_queue_keeps_order_and_deletes_what_was_read(host: RendezvousHost) -> None:
    writer = ReportQueue(connect_store(host.host, host.port), "q/")
    reader = ReportQueue(host.store, "q/")
    assert reader.drain() == []
    for i in range(5):
        writer.push(f"r{i}")
    assert reader.drain(limit=2) == ["r0", "r1"]
    assert reader.drain() == ["r2", "r3", "r4"]
    assert not host.store.check(["q/r/1"])  # read records do not pile up in the store
    writer.push("r5")
    # A new reader (a restarted controller) resumes after what the last one consumed.
    assert ReportQueue(host.store, "q/").drain() == ["r5"]


def test_queue_skips_a_record_whose_writer_died(host: RendezvousHost) -> None:
    queue = ReportQueue(host.store, "q/", skip_after=0.2)
    host.store.add("q/n", 1)  # reserved, never written
    queue.push("after")
    assert queue.drain() == []  # waits a little for the missing record ...
    time.sleep(0.3)
    assert queue.drain() == ["after"]  # ... then gives up on it


def test_reporter_batches_metrics_and_the_latest_goodput(host: RendezvousHost) -> None:
    reporter = Reporter(host.address, "w3")
    reporter.log(10, 0, {"loss": 0.5})
    reporter.set_goodput({"batch_size": 64})
    reporter.log(20, 0, {"loss": 0.25})
    reporter.set_goodput({"batch_size": 128})
    reporter.close()
    batches = [json.loads(r) for r in ReportQueue(host.store, REPORT_PREFIX).drain()]
    assert len(batches) == 1
    (batch,) = batches
    assert batch["worker"] == "w3"
    assert [(m["step"], m["values"]["loss"]) for m in batch["metrics"]] == [(10, 0.5), (20, 0.25)]
    assert batch["goodput"] == {"batch_size": 128}


def test_reporter_flushes_about_once_a_second(host: RendezvousHost) -> None:
    reporter = Reporter(host.address, "w0")
    queue = ReportQueue(host.store, REPORT_PREFIX)
    started = time.monotonic()
    reporter.log(1, 0, {"x": 1.0})  # returns at once
    assert time.monotonic() - started < 0.05
    deadline = time.monotonic() + 5
    got: list[str] = []
    while not got and time.monotonic() < deadline:
        got = queue.drain()
        time.sleep(0.05)
    assert got, "nothing flushed"
    reporter.close()


def test_reporter_without_a_store_sends_nothing() -> None:
    reporter = Reporter(None, "w0")
    reporter.log(1, 0, {"loss": 1.0})
    reporter.set_goodput({"batch_size": 1})
    assert reporter.flushed == 0
    assert reporter._thread is None


def test_log_metrics_alone_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_module, "_reporter", Reporter(None, "w0"))
    report_module.log_metrics(loss=0.5, step=3)
    assert report_module.reporter().flushed == 0
