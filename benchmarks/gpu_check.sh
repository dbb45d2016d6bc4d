#!/usr/bin/env bash
# roiops on a machine with a CUDA GPU, using the torch, Triton and torchvision installed
# there (it installs nothing, so it runs offline): builds the C++ extension in place, runs
# the GPU tests (every test that runs compiled Triton kernels), the GPU benchmark suite
# (roiops bench --device cuda), then the rest of the suite, and prints a short report.
# The steps run in that order so that a run cut short still has what only a GPU gives.
# Logs and the benchmark's results.json (and ratios.png where matplotlib is installed) go
# to $GPU_CHECK_DIR (default: gpu_check/). To record the run in BENCHMARKS.md, copy
# $GPU_CHECK_DIR/bench/results.json to benchmarks/results/ and run benchmarks/report.py.
#
#   bash benchmarks/gpu_check.sh            # or: make gpu-check
#   BENCH_ARGS="--repeats 20 --dtypes float32" bash benchmarks/gpu_check.sh
#   BENCH_ARGS="--workload 'R-FCN 256' --workload 'box head train'" bash benchmarks/gpu_check.sh
#   GPU_CHECK_SUITE=0 bash benchmarks/gpu_check.sh   # leave out the rest of the suite
#   GPU_CHECK_K="rotated or ps" bash benchmarks/gpu_check.sh   # only the GPU tests pytest -k selects
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=${GPU_CHECK_DIR:-gpu_check}
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1

"$PY" - <<'PYEOF' || exit 1
import sys
try:
    import torch, triton, torchvision
except ImportError as e:
    sys.exit(f"gpu_check: {e}; this check uses the torch, triton and torchvision already installed")
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device")
p = torch.cuda.get_device_properties(0)
print(f"gpu_check: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, "
      f"triton {triton.__version__}, torchvision {torchvision.__version__}, python {sys.version.split()[0]}")
PYEOF

# Some toolchains' default gcc link libstdc++ statically, which crashes a torch extension
# at load: prefer the system compiler where there is one.
if [ -x /usr/bin/gcc ] && [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
echo "gpu_check: building roiops._C in place"
"$PY" setup.py -q build_ext --inplace >"$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log"; exit 1; }

status=0
# One worker per core: the GPU tests' time goes mostly to compiling kernels on the CPU.
workers=$("$PY" -c "import os, xdist; print(os.cpu_count())" 2>/dev/null)
xdist=${workers:+-n $workers}
# One OpenMP thread per worker: a worker per core, each with a thread per core, would
# oversubscribe the cores while the tests run their CPU oracles (the float64 reference
# on C = 256 maps) and spin-wait in each of their many small parallel ops.
[ -n "$workers" ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Every test that runs compiled Triton kernels on the GPU: the GPU and Triton suites, and
# the Triton cases of the per-op suites (their ids name the backend or the device).
gpu_files="tests/test_gpu.py tests/test_triton.py tests/test_box_grad_triton.py tests/test_multi_scale.py"
k=${GPU_CHECK_K:-}
echo "gpu_check: GPU tests${k:+ (-k \"$k\")}"
# pytest's 5 (no test selected) is a failure unless GPU_CHECK_K narrowed the selection.
passed() { [ "$1" = 0 ] || { [ "$1" = 5 ] && [ -n "$k" ]; }; }
# -v: every result is logged with its name as it comes, so a run cut short still says
# which tests failed.
"$PY" -m pytest -v -p no:cacheprovider $xdist $gpu_files ${k:+-k "$k"} 2>&1 | tee "$DIR/gpu_tests.log" | tail -25
passed "${PIPESTATUS[0]}" || status=1
"$PY" -m pytest -v -p no:cacheprovider $xdist tests/test_ps_roi.py tests/test_roi_align_rotated.py \
    tests/test_prroi_pool.py tests/test_generic.py tests/test_box_grad.py tests/test_autocast.py tests/test_fuzz.py \
    tests/test_masks.py tests/test_points3d.py \
    -k "(triton or cuda)${k:+ and ($k)}" 2>&1 | tee -a "$DIR/gpu_tests.log" | tail -25
passed "${PIPESTATUS[0]}" || status=1
chart=$("$PY" -c "import matplotlib" 2>/dev/null || echo "--no-chart")
eval "bench_args=(${BENCH_ARGS:-})"  # as a shell would split them: quoted names keep their spaces
echo "gpu_check: python -m roiops bench --device cuda $chart ${BENCH_ARGS:-}"
"$PY" -m roiops bench --device cuda $chart "${bench_args[@]}" --out "$DIR/bench" 2>&1 | tee "$DIR/bench.log" \
    || status=1
if [ "${GPU_CHECK_SUITE:-1}" != 0 ]; then
    echo "gpu_check: the rest of the suite"
    ignore=$(for f in $gpu_files; do printf -- "--ignore=%s " "$f"; done)
    "$PY" -m pytest -q -p no:cacheprovider $xdist tests $ignore 2>&1 | tee "$DIR/suite.log" | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

echo
echo "gpu_check report ($DIR/):"
summary() { grep -E '(passed|failed|error).* in [0-9.]+s' "$1" | tr '\n' ';'; }  # pytest's closing lines
echo "  GPU tests:   $(summary "$DIR/gpu_tests.log")"
grep -oE "(FAILED|ERROR) tests/[^ ]+" "$DIR/gpu_tests.log" | sort -u | head -20 | sed 's/^/    /'  # by name
[ -f "$DIR/suite.log" ] && echo "  rest of the suite: $(summary "$DIR/suite.log")"
echo "  benchmark:   $(tail -1 "$DIR/bench.log")"
exit $status
