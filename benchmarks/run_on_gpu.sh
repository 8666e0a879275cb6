#!/usr/bin/env bash
# Reproduces the GPU results on a CUDA machine that has torch and triton but no network.
# Build the wheels first on a machine with network:
#   maturin build --release -m packages/yirage/Cargo.toml -o .whl
#   pip wheel --no-deps -w .whl packages/yirage-cpu packages/yirage-triton packages/yirage-cuda
# then, on the GPU machine from the repository root:
#   bash benchmarks/run_on_gpu.sh [OUTDIR] [pytest|bench|all]
set -uo pipefail
out=${1:-${OUT:-benchmarks/results}}
what=${2:-all}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/yrsite .whl/*.whl || exit 1
export PYTHONPATH=/tmp/yrsite
export YIRAGE_CACHE_DIR=${YIRAGE_CACHE_DIR:-/tmp/yirage-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m yirage.cli doctor 2>&1 | tee "$out/doctor.txt"
rc=0
if [ "$what" = pytest ] || [ "$what" = all ]; then
  YIRAGE_REQUIRE_DEVICE=1 python3 -m pytest -p no:cacheprovider -m cuda tests/cuda -q -x \
    2>&1 | tee "$out/pytest_cuda.txt" || rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m yirage.cli bench --backend cuda --workloads all --out "$out" \
    2>&1 | tee "$out/bench_log.txt" || rc=1
fi
exit $rc
