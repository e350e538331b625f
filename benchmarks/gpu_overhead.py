"""Per-step throughput on one GPU: a plain loop, DDP under torchrun, and tidal (world 1).

The same model, data, batch and optimizer in three processes (``benchmarks/gpu_worker.py``):

* plain: ``python benchmarks/gpu_worker.py --mode plain``: no process group at all;
* DDP: ``python -m torch.distributed.run --standalone --nproc_per_node 1
  benchmarks/gpu_worker.py --mode ddp``: ``DistributedDataParallel`` on NCCL;
* tidal: ``python -m tidal.cli run --workers 1 [--sync-every K] -- benchmarks/gpu_worker.py
  --mode tidal``: ``ElasticDataParallel`` + ``ElasticDataLoader`` + ``State.step()``.

Models (``benchmarks/gpu_models.py``): MLPs of 2 M and 50 M parameters (batch 512 and
4096), a ResNet-18 on random 224x224 images (batch 128) and a 4-layer transformer (d=512,
sequence 256, batch 32), fp32. Trials alternate the systems (the order rotates from one
trial to the next); each run's warm-up steps are not timed, the device is synchronised only
at the timing windows' boundaries, and a run's figure is the median of its windows. The
table prints the median over trials in ms/step and the throughput ratios tidal/DDP and
tidal/plain (above 1: tidal is faster), and, on CUDA, the host synchronisations per step of
each system after warm-up (``torch.cuda.set_sync_debug_mode("warn")``). ``--json`` writes
everything measured.

    PYTHONPATH=src:. python benchmarks/gpu_overhead.py --json gpu.json
    PYTHONPATH=src:. python benchmarks/gpu_overhead.py --device cpu --quick   # smoke run

``--budget S``: after the first trial, a model's runs of a trial are not started when the
time spent so far plus what they took in the last trial would pass ``S`` seconds (the
later trials may then cover only the first models), so that a scripted check
(``benchmarks/gpu_check.sh``) ends in time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PYTHON, ROOT, Proc, cleanup, env, median
from gpu_models import MODELS, workload

WORKER = str(ROOT / "benchmarks" / "gpu_worker.py")


class Done(Exception):
    """The time budget is spent: no more runs."""


def systems(sync_every: str) -> list[str]:
    """``plain``, ``ddp`` and one tidal variant per ``--sync-every`` value: ``tidal`` at
    tidal's default, ``tidal-k8`` at ``--sync-every 8``."""
    variants = []
    for value in filter(None, (v.strip() for v in sync_every.split(","))):
        if value == "default":
            variants.append("tidal")
        elif value.isdigit() and int(value) >= 1:
            variants.append(f"tidal-k{int(value)}")
        else:
            raise SystemExit(f"--sync-every: expected 'default' or integers >= 1, got {value!r}")
    return ["plain", "ddp", *dict.fromkeys(variants)]


def first_gpu() -> str:
    """The GPU ``tidal run`` gives its first worker (the first of CUDA_VISIBLE_DEVICES, else
    GPU 0): the baselines run on the same one."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        names = [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
        return names[0] if names else ""
    return "0"


def command(
    system: str, model: str, args: argparse.Namespace, work: Path
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one run."""
    worker = [
        WORKER,
        "--model",
        model,
        "--device",
        args.device,
        "--data-on",
        args.data_on,
        "--windows",
        str(args.windows),
        "--sync-steps",
        str(args.sync_steps),
        "--threads",
        str(args.threads),
        "--result",
        str(work / "result.json"),
    ]
    if args.quick:
        worker.append("--quick")
    if args.steps is not None:
        worker += ["--steps", str(args.steps)]
    if args.warmup is not None:
        worker += ["--warmup", str(args.warmup)]
    extra: dict[str, str] = {}
    if args.device == "cuda" and not system.startswith("tidal"):
        extra["CUDA_VISIBLE_DEVICES"] = first_gpu()
    if system == "plain":
        return [PYTHON, *worker, "--mode", "plain"], env(**extra)
    if system == "ddp":
        launcher = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
        return [*launcher, *worker, "--mode", "ddp"], env(**extra)
    tidal = [PYTHON, "-m", "tidal.cli", "run", "--workers", "1", "--run-id", work.name]
    if system.startswith("tidal-k"):
        tidal += ["--sync-every", system.removeprefix("tidal-k")]
    # On the CPU the workers must not be handed a GPU even where there is one.
    extra["TIDAL_BACKEND"] = "nccl" if args.device == "cuda" else "gloo"
    extra["TIDAL_HOME"] = str(work / "home")
    return [*tidal, "--", *worker, "--mode", "tidal"], env(**extra)


def run_one(system: str, model: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run one job to its end; its worker's result, or ``{"error": ...}``."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    argv, environ = command(system, model, args, work)
    started = time.monotonic()
    proc = Proc(argv, work / "run.log", environ)
    code: int | None = None
    with cleanup([proc], lambda: set()):
        try:
            code = proc.popen.wait(timeout=args.run_timeout)
        except Exception:
            code = None
    wall = time.monotonic() - started
    result_file = work / "result.json"
    if code != 0 or not result_file.exists():
        why = f"timed out after {args.run_timeout:.0f}s" if code is None else f"exit {code}"
        tail = "\n".join(f"    {line}" for line in proc.lines[-15:])
        print(f"  {system} {model}: FAILED ({why}); {work / 'run.log'}:\n{tail}", flush=True)
        return {"error": why, "log": str(work / "run.log"), "wall_s": wall}
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["wall_s"] = wall
    return result


def fmt_ms(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    if not num or not den or num != num or den != den:
        return "-"
    return f"{num / den:.3f}"


def fmt_params(n: int | None) -> str:
    if not n:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}k"


def summarise(
    models: list[str], names: list[str], runs: dict[tuple[str, str], list[dict[str, Any]]]
) -> dict[str, Any]:
    """Per model: each system's per-trial ms/step, medians, ratios and sync counts."""
    out: dict[str, Any] = {}
    for model in models:
        entry: dict[str, Any] = {"ms_per_step": {}, "median_ms": {}, "syncs_per_step": {}}
        entry["sync_sites"] = {}
        for system in names:
            good = [r for r in runs.get((model, system), []) if "error" not in r]
            per_trial = [float(r["ms_per_step"]) for r in good if r.get("ms_per_step")]
            entry["ms_per_step"][system] = per_trial
            entry["median_ms"][system] = median(per_trial) if per_trial else None
            syncs = [float(r["syncs_per_step"]) for r in good if "syncs_per_step" in r]
            entry["syncs_per_step"][system] = median(syncs) if syncs else None
            if good and "sync_sites" in good[0]:
                entry["sync_sites"][system] = good[0]["sync_sites"]
            if good:
                entry.setdefault("params", good[0]["params"])
                entry.setdefault("batch", good[0]["batch"])
                entry.setdefault("steps", good[0]["steps"])
                entry.setdefault("warmup", good[0]["warmup"])
            entry.setdefault("failures", 0)
            entry["failures"] += len(runs.get((model, system), [])) - len(good)
        medians = entry["median_ms"]
        entry["samples_per_s"] = {
            s: entry["batch"] / (m / 1e3) if m and "batch" in entry else None
            for s, m in medians.items()
        }
        # Throughput ratios (time ratios inverted): above 1, tidal is faster.
        for system in names[2:]:
            t = medians.get(system)
            for base in ("ddp", "plain"):
                b = medians.get(base)
                entry[f"ratio_{system}_{base}"] = b / t if t and b else None
            pairs = zip(entry["ms_per_step"][system], entry["ms_per_step"]["ddp"], strict=False)
            entry[f"per_trial_ratio_{system}_ddp"] = [d / t for t, d in pairs]
        out[model] = entry
    return out


def table(summary: dict[str, Any], names: list[str], info: dict[str, Any], counted: int) -> str:
    """The results at 80 columns (``counted``: the steps whose host syncs were counted)."""
    lines = []
    what = info.get("gpu") or f"CPU ({info.get('threads', '?')} torch threads per process)"
    versions = f"torch {info.get('torch', '?')}"
    if info.get("cuda"):
        versions += f", CUDA {info['cuda']}, NCCL {info.get('nccl', '?')}"
    lines.append(f"{what}; {versions}")
    # Trials that timed tidal, per model (a budget may leave the last trial short).
    counts = sorted({len(e["ms_per_step"].get(names[2], [])) for e in summary.values()}) or [0]
    over = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    lines.append(f"median ms/step over {over} trial(s); ratios are throughput (>1: tidal faster)")
    head = (
        f"{'model':<18}{'batch':>6}{'params':>8}{'plain':>8}{'DDP':>8}{'tidal':>8}"
        f"{'t/DDP':>7}{'t/plain':>8}{'syncs':>7}"
    )
    lines += [head, "-" * len(head)]
    for model, entry in summary.items():
        m = entry["median_ms"]
        for system in names[2:]:
            label = model if system == "tidal" else f"{model} k={system.removeprefix('tidal-k')}"
            syncs = entry["syncs_per_step"].get(system)
            lines.append(
                f"{label:<18}{entry.get('batch', '-'):>6}{fmt_params(entry.get('params')):>8}"
                f"{fmt_ms(m.get('plain')):>8}{fmt_ms(m.get('ddp')):>8}{fmt_ms(m.get(system)):>8}"
                f"{fmt_ratio(m.get('ddp'), m.get(system)):>7}"
                f"{fmt_ratio(m.get('plain'), m.get(system)):>8}"
                f"{'-' if syncs is None else f'{syncs:.1f}':>7}"
            )
    if any(e["syncs_per_step"].get("plain") is not None for e in summary.values()):
        lines.append("")
        lines.append("host syncs per step after warm-up (" + " / ".join(names) + "),")
        lines.append(f"and where (calls in the {counted} steps counted):")
        for model, entry in summary.items():
            per_step = entry["syncs_per_step"]
            per_system = " / ".join(
                "-" if per_step.get(k) is None else f"{per_step[k]:.1f}" for k in names
            )
            lines.append(f"  {model}: {per_system}")
            for system in names:
                for site, n in list(entry["sync_sites"].get(system, {}).items())[:4]:
                    lines.append(f"    {system} {site} ({n})"[:80])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: per model)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default: per model)")
    parser.add_argument("--trials", type=int, help="runs of each system (default 3; quick 2)")
    parser.add_argument(
        "--sync-every",
        default="default",
        help="tidal variants: 'default' (tidal's own) and/or K values, e.g. default,8",
    )
    parser.add_argument("--quick", action="store_true", help="tiny models: a smoke run")
    parser.add_argument("--data-on", choices=("device", "cpu"), default="device")
    parser.add_argument("--windows", type=int, default=5, help="timing windows per run")
    parser.add_argument("--sync-steps", type=int, default=20, help="steps whose syncs count")
    parser.add_argument("--threads", type=int, help="torch threads (default: 1 on cpu)")
    parser.add_argument("--budget", type=float, default=0.0, help="seconds; 0: no limit")
    parser.add_argument("--run-timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--out", help="keep each run's log and result here")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in models:
        workload(model, args.quick)  # an unknown name stops here, before any run
    names = systems(args.sync_every)
    trials = args.trials if args.trials is not None else (2 if args.quick else 3)
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-gpu-overhead-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"logs in {out}", flush=True)

    started = time.monotonic()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    info: dict[str, Any] = {}
    done = 0
    stopped = None

    def report(final: bool) -> int:
        """Summarise what ran so far; the table at the end, the JSON every time."""
        summary = summarise(models, names, runs)
        failures = int(sum(e["failures"] for e in summary.values()))
        elapsed = time.monotonic() - started
        if final:
            print()
            print(table(summary, names, info, args.sync_steps))
            print(f"\n{done} trial(s) in {elapsed:.0f}s; {failures} failed run(s); logs in {out}")
        if args.json:
            document = {
                "device": args.device,
                "quick": args.quick,
                "data_on": args.data_on,
                "trials_planned": trials,
                "trials_done": done,
                "stopped": stopped,
                "systems": names,
                "environment": {
                    k: info[k] for k in ("gpu", "torch", "cuda", "nccl", "threads") if k in info
                },
                "elapsed_s": elapsed,
                "failed_runs": failures,
                "models": summary,
                "runs": {f"{m}/{s}": r for (m, s), r in runs.items()},
            }
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(document, indent=1))
            if final:
                print(f"summary: {args.json}")
        return failures

    # A SIGTERM (a time limit) ends the run as Ctrl-C does: the job running now is
    # stopped with its whole process group, and what was measured is still reported.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Seconds one model's runs of a trial took, to see whether the next fit the budget.
    cost: dict[str, float] = {}
    try:
        for trial in range(trials):
            for model in models:
                elapsed = time.monotonic() - started
                guess = cost.get(model, max(cost.values(), default=0.0))
                if args.budget and trial and elapsed + guess > args.budget:
                    stopped = (
                        f"budget: {elapsed:.0f}s of {args.budget:.0f}s spent, {model}'s runs "
                        f"take ~{guess:.0f}s"
                    )
                    raise Done
                group = time.monotonic()
                shift = trial % len(names)
                for system in names[shift:] + names[:shift]:
                    result = run_one(system, model, args, out / f"t{trial}-{model}-{system}")
                    runs.setdefault((model, system), []).append(result)
                    if "error" not in result:
                        info = info or result
                        syncs = result.get("syncs_per_step")
                        print(
                            f"trial {trial} {model:<12} {system:<9} "
                            f"{fmt_ms(result['ms_per_step']):>8} ms/step"
                            + ("" if syncs is None else f"  {syncs:.1f} syncs/step")
                            + f"  ({result['wall_s']:.0f}s)",
                            flush=True,
                        )
                cost[model] = time.monotonic() - group
                report(final=False)  # what a hard stop would otherwise lose
            done += 1
    except Done:
        print(f"stopping in trial {done} ({stopped})", flush=True)
    except KeyboardInterrupt:
        stopped = f"interrupted in trial {done}"
        print(f"\n{stopped}; reporting the {done} complete trial(s) and the runs so far")
    failures = report(final=True)
    sys.exit(1 if failures or not done else 0)


if __name__ == "__main__":
    main()
