#!/usr/bin/env bash
# The GPU tests of the kernels, spread over every GPU of the host, each outcome named as it happens.
#
#   bash scripts/gpu_tests.sh OUTDIR [SECONDS]
#
# The test files of TEST_GROUPS below run as one pytest per GPU (CUDA_VISIBLE_DEVICES), each with -v (a run
# cut by its limit still names every failure it reached) and xdist workers; the NCCL tests run last on
# all the GPUs together. Logs: OUTDIR/gpu_tests_<group>.log; printed: each log's FAILED/ERROR lines and
# last line. SECONDS (default 540) bounds the whole run. PYTHON names the interpreter (default python3); GPUS,
# the number of GPUs to spread over (default: all).
# The kernels run each launcher's default configuration (ATTNKIT_AUTOTUNE=0, as scripts/gpu_session.sh does):
# with the autotuner every new shape compiles every candidate, and a head-dim test takes minutes; the
# tests of the autotuner set it themselves. A test past TEST_SECONDS (default 240) fails with its stack
# (pytest-timeout), so a slow test is named rather than cutting the run.
set -u
out=${1:?OUTDIR}; limit=${2:-540}
mkdir -p "$out"; export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ATTNKIT_AUTOTUNE=${ATTNKIT_AUTOTUNE:-0}
PY=${PYTHON:-python3}
per_test=$($PY -c "import pytest_timeout" 2>/dev/null && echo "--timeout ${TEST_SECONDS:-240}")
gpus=${GPUS:-$($PY -c "import torch; print(torch.cuda.device_count())")}
[ "$gpus" -ge 1 ] || { echo "no CUDA GPU"; exit 2; }
# Groups of about equal compile time (each new shape compiles on a GPU); the heaviest first.
TEST_GROUPS=(
  "tests/kernels/test_flash_features.py tests/kernels/test_properties.py"
  "tests/kernels/test_flash.py tests/kernels/test_flash_backward_designs.py tests/kernels/test_flash_dispatch.py"
  "tests/kernels/test_paged.py tests/kernels/test_paged_head_dims.py tests/kernels/test_paged_extend.py tests/kernels/test_paged_fp8.py tests/kernels/test_paged_window.py tests/kernels/test_paged_host.py"
  "tests/kernels/test_flash_hopper.py tests/kernels/test_flash_hopper_backward.py tests/kernels/test_flash_fp8.py tests/kernels/test_runners.py tests/kernels/test_strides.py tests/kernels/test_rope_append_fp8.py tests/base/test_device.py tests/classroom/test_grading_gpu.py"
)
workers=$(( $(nproc) / (gpus < ${#TEST_GROUPS[@]} ? gpus : ${#TEST_GROUPS[@]}) ))
workers=$(( workers > 12 ? 12 : (workers < 1 ? 1 : workers) ))
started=$(date +%s)
for i in "${!TEST_GROUPS[@]}"; do
  gpu=$(( i % gpus ))
  # groups sharing a GPU run one after the other; each GPU's chain in the background
  echo "${TEST_GROUPS[$i]}" >> "$out/.gpu_$gpu"
done
for f in "$out"/.gpu_*; do
  gpu=${f##*_}
  (
    n=0
    while read -r files; do
      left=$(( limit - 60 - ($(date +%s) - started) ))
      [ "$left" -gt 30 ] || break
      CUDA_VISIBLE_DEVICES=$gpu timeout "$left" $PY -m pytest -o addopts="" -p no:cacheprovider -v -rfE \
        -n "$workers" --durations=10 $per_test $files > "$out/gpu_tests_${gpu}_$n.log" 2>&1
      echo "exit $? after $(( $(date +%s) - started )) s" >> "$out/gpu_tests_${gpu}_$n.log"
      n=$(( n + 1 ))
    done < "$f"
  ) &
done
wait
rm -f "$out"/.gpu_*
if [ "$gpus" -ge 2 ]; then
  left=$(( limit - ($(date +%s) - started) ))
  [ "$left" -gt 30 ] && timeout "$left" $PY -m pytest -o addopts="" -p no:cacheprovider -v -rs \
    tests/distributed/test_distributed_nccl.py > "$out/gpu_tests_nccl.log" 2>&1
fi
for log in "$out"/gpu_tests_*.log; do
  echo "== $log"; grep -hE "(FAILED|ERROR) " "$log" | sort -u | head -20
  grep -hE "^=+ .*(passed|failed|error|skipped)" "$log" | tail -n 1; tail -n 1 "$log"
done
