#!/usr/bin/env bash
# roiops on a machine with a CUDA GPU, using the torch, Triton and torchvision installed
# there (it installs nothing, so it runs offline): builds the C++ extension in place, runs
# the GPU tests, then the whole suite, then the GPU benchmark suite (roiops bench --device
# cuda), and prints a short report. Logs and the benchmark's results.json (and ratios.png
# where matplotlib is installed) go to $GPU_CHECK_DIR (default: gpu_check/).
#
#   bash benchmarks/gpu_check.sh            # or: make gpu-check
#   BENCH_ARGS="--repeats 20 --dtypes float32" bash benchmarks/gpu_check.sh
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
echo "gpu_check: GPU tests"
"$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_triton.py 2>&1 | tee "$DIR/gpu_tests.log" \
    | tail -25 || status=1
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "gpu_check: whole suite"
xdist=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 8")
"$PY" -m pytest -q -p no:cacheprovider $xdist tests 2>&1 | tee "$DIR/suite.log" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || status=1
chart=$("$PY" -c "import matplotlib" 2>/dev/null || echo "--no-chart")
echo "gpu_check: python -m roiops bench --device cuda $chart ${BENCH_ARGS:-}"
"$PY" -m roiops bench --device cuda $chart ${BENCH_ARGS:-} --out "$DIR/bench" 2>&1 | tee "$DIR/bench.log" || status=1

echo
echo "gpu_check report ($DIR/):"
echo "  GPU tests:   $(grep -E '(passed|failed|error)' "$DIR/gpu_tests.log" | tail -1)"
echo "  whole suite: $(grep -E '(passed|failed|error)' "$DIR/suite.log" | tail -1)"
echo "  benchmark:   $(tail -1 "$DIR/bench.log")"
exit $status
