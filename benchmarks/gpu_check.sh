#!/usr/bin/env bash
# The GPU check, in one unattended run of at most ~8.5 minutes: the machine (nvidia-smi), the
# versions of torch, CUDA and NCCL, the tests marked `gpu` (pytest -m gpu tests/runtime),
# benchmarks/gpu_overhead.py within the time left, then a new worker's first step
# (benchmarks/first_step.py) and, if asked for, a profile. See "GPU" in docs/benchmarks.md.
#
#   benchmarks/gpu_check.sh          # on a machine with an NVIDIA GPU
#   benchmarks/gpu_check.sh --cpu    # anywhere: the tests skip, the benchmark runs --quick
#
# Writes gpu_check.log (everything printed), gpu_overhead.json, first_step.json and
# gpu_logs.tar.gz (each run's log, the tests' work folders) into $OUT, or into a new
# folder under /tmp. Knobs
# (environment): PYTHON (python3), GPU_CHECK_SECONDS (500: the whole script),
# GPU_TEST_SECONDS (210: the tests; 0 skips them), GPU_TEST_TIMEOUT (150: one test),
# GPU_BENCH_ARGS (more options for gpu_overhead.py, e.g. "--models mlp-2m,mlp-50m"),
# GPU_PROFILE_MODEL (empty: no profile; a model, e.g. mlp-2m: a cProfile of its DDP and
# tidal steps at the end, about 75 s).
set -u -o pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
DEVICE=cuda
[ "${1:-}" = "--cpu" ] && DEVICE=cpu
TOTAL=${GPU_CHECK_SECONDS:-500}
TEST_SECONDS=${GPU_TEST_SECONDS:-210}
TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150}
OUT=${OUT:-$(mktemp -d /tmp/tidal-gpu-check.XXXXXX)}
WORK=$(mktemp -d /tmp/tidal-gpu-work.XXXXXX)
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

section() { printf '\n=== %s (%ds)\n' "$1" "$SECONDS"; }

check() {
    section "machine"
    date -u
    echo "$(uname -srm); $(nproc) CPUs; device $DEVICE; output in $OUT"
    if command -v nvidia-smi >/dev/null; then
        timeout 30 nvidia-smi
        timeout 30 nvidia-smi topo -m 2>/dev/null | head -20
    else
        echo "nvidia-smi: not found"
    fi

    section "versions"
    "$PY" - <<'EOF'
import importlib
import importlib.metadata as metadata
import sys

import torch

print(f"python {sys.version.split()[0]} ({sys.executable})")
print(f"torch {torch.__version__}; built for CUDA {torch.version.cuda}")
print(f"cuda available: {torch.cuda.is_available()}; GPUs: {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
if torch.cuda.is_available():
    try:
        version = torch.cuda.nccl.version()
        print("NCCL", ".".join(map(str, version)) if isinstance(version, tuple) else version)
    except Exception as exc:
        print(f"NCCL: unknown ({exc})")
    print(f"cuDNN {torch.backends.cudnn.version()}")
# What `tidal run`, its workers and the gpu tests import beyond torch.
needed = {
    "pydantic": "pydantic", "pydantic_core": "pydantic-core",
    "annotated_types": "annotated-types", "typing_inspection": "typing-inspection",
    "typing_extensions": "typing-extensions", "typer": "typer", "rich": "rich",
    "numpy": "numpy", "sklearn": "scikit-learn", "pytest": "pytest",
    "pytest_timeout": "pytest-timeout", "anyio": "anyio",
}
missing = []
for module, dist in needed.items():
    try:
        importlib.import_module(module)
        print(f"  {dist} {metadata.version(dist)}")
    except Exception as exc:
        missing.append(dist)
        print(f"  {dist}: MISSING ({exc})")
if missing:
    print(f"missing: {' '.join(missing)} (carry their wheels; docs/benchmarks.md, 'GPU')")
EOF

    local tests=0
    if [ "$TEST_SECONDS" -gt 0 ]; then
        section "tests: pytest -m gpu tests/runtime (at most ${TEST_SECONDS}s)"
        local per_test=()
        "$PY" -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout "$TEST_TIMEOUT")
        # SIGINT first: pytest then stops the test and its fixtures stop the launchers.
        timeout -s INT -k 30 "$TEST_SECONDS" "$PY" -m pytest -m gpu tests/runtime \
            -p no:cacheprovider -v -rs --basetemp "$WORK/pytest" "${per_test[@]}"
        tests=$?
        echo "pytest exit status: $tests"
    fi

    # Time kept for the first-step benchmark (about 60 s on a GPU host) and the profile
    # after it.
    local reserve=70
    [ "$DEVICE" = cuda ] && [ -n "${GPU_PROFILE_MODEL:-}" ] && reserve=145
    local left=$((TOTAL - SECONDS - 15 - reserve))
    [ "$left" -lt 90 ] && left=90
    # The budget leaves room for one model's runs (45-50 s on an H200) to finish; the first
    # trial runs whatever the budget (about 190 s for the four models on an H200).
    local budget=$((left - 45))
    [ "$budget" -lt 60 ] && budget=60
    local quick=()
    [ "$DEVICE" = cpu ] && quick=(--quick)
    section "benchmark: gpu_overhead.py --device $DEVICE (budget ${budget}s, at most ${left}s)"
    # shellcheck disable=SC2086  # GPU_BENCH_ARGS holds several options
    timeout -s INT -k 30 "$left" "$PY" benchmarks/gpu_overhead.py --device "$DEVICE" \
        "${quick[@]}" --budget "$budget" --json "$OUT/gpu_overhead.json" \
        --out "$WORK/bench" ${GPU_BENCH_ARGS:-}
    local bench=$?
    echo "benchmark exit status: $bench"

    # A new worker's first step, cold and from a warm interpreter: what the CUDA context
    # adds to a warm start (about 30 s on a GPU host).
    section "first step of a new worker: first_step.py --device $DEVICE"
    timeout -s INT -k 10 90 "$PY" benchmarks/first_step.py --device "$DEVICE" --trials 3 \
        --json "$OUT/first_step.json"
    echo "first_step exit status: $?"

    # Where the host time of a launch-bound step goes: a cProfile of DDP's and tidal's
    # timed steps (about 30 s), into $OUT/profile_{ddp,tidal}.txt.
    local model=${GPU_PROFILE_MODEL:-}
    if [ "$DEVICE" = cuda ] && [ -n "$model" ] && [ $((TOTAL - SECONDS)) -gt 45 ]; then
        section "profile: $model, DDP and tidal (gpu_worker.py --profile)"
        local worker=(benchmarks/gpu_worker.py --model "$model" --device cuda)
        CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 10 40 "$PY" \
            -m torch.distributed.run --standalone --nproc_per_node 1 "${worker[@]}" \
            --mode ddp --result "$WORK/profile_ddp.json" --profile "$OUT/profile_ddp.txt"
        TIDAL_BACKEND=nccl TIDAL_HOME="$WORK/profile_home" timeout -k 10 50 "$PY" \
            -m tidal.cli run --workers 1 -- "${worker[@]}" \
            --mode tidal --result "$WORK/profile_tidal.json" --profile "$OUT/profile_tidal.txt"
    fi

    tar czf "$OUT/gpu_logs.tar.gz" -C "$WORK" . 2>/dev/null || echo "could not pack $WORK"
    section "done: tests $tests, benchmark $bench; logs in $OUT"
    [ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
}

check 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$status"
