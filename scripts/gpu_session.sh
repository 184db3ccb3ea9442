#!/usr/bin/env bash
# One recording session on a GPU, in two phases so that compiling does not eat the timing budget:
#
#   bash scripts/gpu_session.sh warm OUTDIR   # checks + every benchmark once, all in parallel: fills
#                                             # Triton's on-disk cache; the checks' logs are kept, the
#                                             # timings (taken side by side) are thrown away
#   bash scripts/gpu_session.sh time OUTDIR   # the benchmarks one after another, alone on the GPU,
#                                             # their kernels loaded from the cache: the recorded CSVs
#
# The same pairs for the kernel work of issue 17: tune-warm / tune-time (the block-configuration sweep,
# then Nsight Compute profiles), and record-warm, then record-kernels and record-suites (the flash
# features, backward designs and FP8 at fixed configurations, then the autotuned ladder and SDPA suite).
# After a change to the backward alone: tune-backward (its sweep, compiled and timed in one call), then
# record-backward-warm, record-backward and record-backward-profile. After a change of the rung "best" or
# of the default backward: record-best-warm, then record-best (the ladder and the SDPA suite).
#
# The performance targets, every row in one call: targets (docs/performance_targets.md; --results reads OUTDIR).
#
# To decide what to change next: explore (the host's share of a short call, layer by layer; the D = 256
# sweep; the FP8 forward's configurations), each compiled in parallel first, then timed alone.
#
# Both phases must run on the same machine (the cache lives in ~/.triton). Each step has a time limit;
# a step that fails or runs out of time is logged and the others go on.
set -u
phase=${1:?warm or time}; out=${2:?OUTDIR}
mkdir -p "$out"; export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.} ATTNKIT_AUTOTUNE=0
log() { echo "[$(date +%T)] $*"; }

step() {   # step SECONDS LOGFILE command...
    local limit=$1 logfile=$2; shift 2
    log "start: $*"
    timeout "$limit" "$@" >"$logfile" 2>&1
    log "exit $? after step: $* (log $logfile)"
}

warm_kernel_scripts() {   # warm_kernel_scripts SECONDS DIR: the features' checks and timings, the backward
    local limit=$1 dir=$2   # designs and FP8, each in the background (the caller waits)
    for case in 0 1 2 3 4 5; do
        step "$limit" $dir/check_$case.log python scripts/gpu_flash_features.py $dir --check-only --case $case &
    done
    step "$limit" $dir/features.log python scripts/gpu_flash_features.py $dir/features --no-check &
    step "$limit" "$out/backward_warm.log" python scripts/gpu_flash_backward.py $dir/backward --budget 400 &
    step "$limit" $dir/fp8.log python scripts/gpu_flash_fp8.py $dir/fp8 &
}

failures() {   # failures LOG: the tests a verbose pytest log names as failed (a run cut off by its limit
    grep -hE "(FAILED|ERROR) " "$1" | sort -u | head -n 20   # still names them), then its last line
    tail -n 1 "$1"
}

collect() {   # collect LOGDIR OUTFILE: every log of a timing phase in one file ($OUT holds few files)
    for f in $1/*.log; do echo "===== $f"; cat "$f"; done > "$2"
    tail -n 12 $1/*.log
}

if [ "$phase" = tune-warm ]; then   # the block-configuration sweep compiled in parallel, nbval beside it
    warm=/tmp/warm; mkdir -p $warm; parts=10
    for part in $(seq 0 $((parts - 1))); do
        step 500 $warm/sweep_$part.log python scripts/gpu_flash_sweep.py $warm/sweep --compile-only --part $part/$parts &
    done
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --find-links .whl --target /tmp/site nbval ipywidgets nbclient \
            && step 500 "$out/nbval_gpu.log" env PYTHONPATH=/tmp/site:$PWD python -m pytest -p no:cacheprovider -v -n 6 \
               --dist loadfile --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
               notebooks solutions &
    fi
    ncu --version | tail -n 1
    wait
    cat $warm/sweep_*.log > "$out/sweep_compile.log"
    echo "candidates passed: $(grep -c " pass$" "$out/sweep_compile.log")"; grep -v " pass$" "$out/sweep_compile.log" | head -30
    tail -n 25 "$out/nbval_gpu.log" 2>/dev/null
elif [ "$phase" = tune-backward ]; then   # the backward's sweep alone: compiled in parallel, then timed alone
    warm=/tmp/warm; logs=/tmp/timed; mkdir -p $warm $logs; parts=12
    for part in $(seq 0 $((parts - 1))); do
        step 280 $warm/sweep_$part.log python scripts/gpu_flash_sweep.py $warm/sweep --compile-only --backward-only \
            --part $part/$parts &
    done
    wait
    step 300 $logs/1_sweep.log python scripts/gpu_flash_sweep.py "$out" --backward-only
    collect $logs "$out/session.log" >/dev/null
    tail -n 30 $logs/1_sweep.log
elif [ "$phase" = explore ]; then   # host profile, D = 256 sweep, FP8 sweep: compiled together, timed alone
    warm=/tmp/warm; logs=/tmp/timed; mkdir -p $warm $logs; parts=10
    for part in $(seq 0 $((parts - 1))); do
        step 220 $warm/sweep_$part.log python scripts/gpu_flash_sweep.py $warm/sweep --compile-only --head-dim-256 \
            --part $part/$parts &
    done
    step 220 $warm/host.log python scripts/gpu_flash_host_profile.py &
    step 220 $warm/fp8.log python scripts/gpu_flash_fp8.py $warm/fp8 --sweep &
    wait
    grep -h "ERROR\|FAIL" $warm/sweep_*.log | head -20
    step 60 $logs/1_host.log python scripts/gpu_flash_host_profile.py
    step 100 $logs/2_fp8_sweep.log python scripts/gpu_flash_fp8.py "$out" --sweep
    step 190 $logs/3_sweep_d256.log python scripts/gpu_flash_sweep.py "$out" --head-dim-256
    collect $logs "$out/session.log" >/dev/null
    grep -h "us$\|=====" $logs/1_host.log; tail -n 40 $logs/2_fp8_sweep.log; grep -v "^\[.*(('" $logs/3_sweep_d256.log | tail -n 30
elif [ "$phase" = tune-time ]; then   # the sweep timed alone, then Triton's kernel metadata and ncu profiles
    logs=/tmp/timed; prof=/tmp/prof; mkdir -p $logs $prof
    step 330 $logs/1_sweep.log python scripts/gpu_flash_sweep.py "$out"
    step 60 $logs/2_meta.log python scripts/gpu_flash_profile.py --triton-meta "$out/triton_kernels.csv"
    for case in $(python -c "import sys; sys.path.insert(0, 'scripts'); import gpu_flash_profile as p; print(*p.CASES)"); do
        step 60 $logs/3_ncu_$case.log ncu --profile-from-start off --set full --clock-control none -f -o $prof/$case \
            python scripts/gpu_flash_profile.py $case
        ncu --import $prof/$case.ncu-rep --csv --page raw > $prof/$case.csv 2>>$logs/3_ncu_$case.log
    done
    python scripts/merge_ncu_csv.py "$prof" "$out/ncu_raw.csv"
    collect $logs "$out/session.log" >/dev/null
    tail -n 30 $logs/1_sweep.log; tail -n 3 $logs/3_ncu_*.log
elif [ "$phase" = record-warm ]; then   # every recorded kernel compiled in parallel (autotuned suites included)
    warm=/tmp/warm; mkdir -p $warm
    for part in $(seq 0 5); do   # 10 parts beside the rest ran out of GPU memory in 4 of them
        step 540 $warm/flash_$part.log env ATTNKIT_AUTOTUNE=1 python scripts/warm_suites.py flash $part/6 &
    done
    for n in 1024 16384; do
        step 540 $warm/ladder_$n.log env ATTNKIT_AUTOTUNE=1 python scripts/warm_suites.py ladder $n &
    done
    warm_kernel_scripts 400 $warm
    step 540 "$out/pytest_gpu.log" python -m pytest -o addopts="" -p no:cacheprovider -v -n 3 \
        tests/kernels/test_flash_backward_designs.py tests/kernels/test_flash_features.py &
    wait
    cat $warm/check_*.log > "$out/checks.log"
    tail -n 4 $warm/*.log > "$out/warm_tails.log"
    grep -h "FAIL\|failures\|Error" $warm/check_*.log "$out/backward_warm.log" | head -20
    tail -n 2 $warm/flash_*.log $warm/ladder_*.log; failures "$out/pytest_gpu.log"
elif [ "$phase" = record-backward-warm ]; then   # after a change to the backward: what records it, compiled
    warm=/tmp/warm; mkdir -p $warm                 # in parallel, and the GPU tests of the backward and features
    for part in $(seq 0 5); do
        step 500 $warm/flash_$part.log env ATTNKIT_AUTOTUNE=1 python scripts/warm_suites.py flash $part/6 &
    done
    warm_kernel_scripts 400 $warm
    step 500 "$out/pytest_gpu.log" python -m pytest -o addopts="" -p no:cacheprovider -v -n 3 \
        tests/kernels/test_flash_backward_designs.py tests/kernels/test_flash_features.py &
    step 300 "$out/compiled.log" python -m attnkit.analysis.compiled &
    wait
    cat $warm/check_*.log > "$out/checks.log"
    grep -h "FAIL\|failures\|Error" $warm/check_*.log "$out/backward_warm.log" | head -20
    tail -n 2 $warm/flash_*.log; failures "$out/pytest_gpu.log"; cat "$out/compiled.log"
elif [ "$phase" = record-backward ]; then   # then, alone: the SDPA suite (autotuned) and the backward designs
    logs=/tmp/timed; mkdir -p $logs
    step 400 $logs/1_flash.log env ATTNKIT_AUTOTUNE=1 python -m attnkit.bench.suites --out "$out" flash
    step 150 $logs/2_backward.log python scripts/gpu_flash_backward.py "$out" --budget 400
    collect $logs "$out/session_backward.log"
elif [ "$phase" = record-backward-profile ]; then   # the backward's profiles and the features' timings
    logs=/tmp/timed_more prof=/tmp/prof; mkdir -p $logs $prof   # (and the host's share of short calls)
    step 200 $logs/1_overhead.log python scripts/gpu_flash_overhead.py "$out" --no-fp32-check
    for case in bwd_two_kernels bwd_two_kernels_desc bwd_atomic_dq bwd_cudnn; do
        step 60 $logs/2_ncu_$case.log ncu --profile-from-start off --set full --clock-control none -f -o $prof/$case \
            python scripts/gpu_flash_profile.py $case
        ncu --import $prof/$case.ncu-rep --csv --page raw > $prof/$case.csv 2>>$logs/2_ncu_$case.log
    done
    python scripts/merge_ncu_csv.py "$prof" "$out/ncu_raw_backward.csv"
    step 120 $logs/3_features.log python scripts/gpu_flash_features.py "$out" --no-check
    collect $logs "$out/session_profile.log"
elif [ "$phase" = record-best-warm ]; then   # after a change of the rung "best" (the warp-specialised forward):
    warm=/tmp/warm; mkdir -p $warm             # the suites it records, compiled in parallel, and its GPU tests
    for part in $(seq 0 5); do
        step 500 $warm/flash_$part.log env ATTNKIT_AUTOTUNE=1 python scripts/warm_suites.py flash $part/6 &
    done
    for n in 1024 4096 16384; do
        step 500 $warm/ladder_$n.log env ATTNKIT_AUTOTUNE=1 python scripts/warm_suites.py ladder $n &
    done
    step 500 "$out/pytest_gpu.log" python -m pytest -o addopts="" -p no:cacheprovider -v -n 5 \
        tests/kernels/test_flash.py tests/kernels/test_flash_hopper.py tests/kernels/test_flash_backward_designs.py \
        tests/kernels/test_flash_hopper_backward.py &
    wait
    tail -n 2 $warm/flash_*.log $warm/ladder_*.log; failures "$out/pytest_gpu.log"
elif [ "$phase" = record-best ]; then   # then, alone: the ladder and the SDPA suite (one recording run)
    logs=/tmp/timed_suites; mkdir -p $logs
    step 170 $logs/1_ladder.log env ATTNKIT_AUTOTUNE=1 python -m attnkit.bench.suites --out "$out" flash_ladder
    step 400 $logs/2_flash.log env ATTNKIT_AUTOTUNE=1 python -m attnkit.bench.suites --out "$out" flash
    collect $logs "$out/session_suites.log"
elif [ "$phase" = record-kernels ]; then   # timings at fixed configurations: features, backward designs, FP8
    logs=/tmp/timed; mkdir -p $logs
    step 110 $logs/1_features.log python scripts/gpu_flash_features.py "$out" --no-check
    step 150 $logs/2_backward.log python scripts/gpu_flash_backward.py "$out" --budget 400
    step 70 $logs/3_fp8.log python scripts/gpu_flash_fp8.py "$out"
    collect $logs "$out/session_kernels.log"
elif [ "$phase" = record-suites ]; then   # the autotuned suites: the ladder, then attnkit against SDPA
    logs=/tmp/timed_suites; mkdir -p $logs
    step 160 $logs/1_ladder.log env ATTNKIT_AUTOTUNE=1 python -m attnkit.bench.suites --out "$out" flash_ladder
    step 400 $logs/2_flash.log env ATTNKIT_AUTOTUNE=1 python -m attnkit.bench.suites --out "$out" flash
    collect $logs "$out/session_suites.log"
elif [ "$phase" = targets ]; then   # every row of docs/performance_targets.md, recorded alone, then the table
    logs=/tmp/timed_targets; mkdir -p $logs
    step 900 $logs/1_headdims.log python scripts/gpu_flash_headdims.py "$out" --quick
    step 600 $logs/2_broadcast.log python scripts/gpu_flash_broadcast_do.py "$out" --repeats 5
    step 600 $logs/3_eager.log python scripts/gpu_flash_eager.py "$out" --repeats 5
    step 900 $logs/4_paged.log python scripts/gpu_paged.py --out "$out" --mode eager fp8 headdims
    step 600 $logs/5_fp8.log python scripts/gpu_flash_fp8.py "$out"
    step 300 $logs/6_paged_fp8.log python -m attnkit.bench.paged fp8 "$out" --decode-only
    step 900 $logs/7_features.log python scripts/gpu_flash_features.py "$out" --no-check
    collect $logs "$out/session_targets.log"
    python -m attnkit.bench.targets --results "$out" | tee "$out/targets.md"
elif [ "$phase" = warm ]; then
    warm=/tmp/warm; mkdir -p $warm
    warm_kernel_scripts 300 $warm
    step 300 $warm/paged_fp8.log python -m attnkit.bench.paged fp8 $warm/paged --decode-only &
    step 300 $warm/serving.log python -m attnkit.bench.suites --out $warm/serving serving_features &
    step 300 $warm/profile.log python -m attnkit.bench.suites --out $warm/profile decode_profile &
    step 300 "$out/pytest_gpu.log" python -m pytest -o addopts="" -p no:cacheprovider -v -n 4 \
        tests/serving/test_engine_graphs.py tests/kernels/test_paged_fp8.py tests/kernels/test_paged_window.py tests/kernels/test_strides.py &
    if [ -d .whl ]; then   # the lessons under nbval (wheels from ../shared/tools/device-wheels, carried)
        python3 -m pip install -q --no-index --find-links .whl --target /tmp/site nbval ipywidgets nbclient \
            && step 300 "$out/nbval_gpu.log" env PYTHONPATH=/tmp/site:. python -m pytest -p no:cacheprovider -v -n 4 \
               --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg notebooks solutions &
    fi
    wait
    cat $warm/check_*.log > "$out/checks.log"
    tail -n 5 $warm/*.log > "$out/warm_tails.log"
    grep -h "FAIL\|failures\|Error" $warm/check_*.log "$out/backward_warm.log" | head -40
    failures "$out/pytest_gpu.log"; failures "$out/nbval_gpu.log" 2>/dev/null
else
    logs=/tmp/timed; mkdir -p $logs
    step 100 $logs/1_features.log python scripts/gpu_flash_features.py "$out" --no-check
    step 120 $logs/2_backward.log python scripts/gpu_flash_backward.py "$out" --budget 400
    step 60 $logs/3_fp8.log python scripts/gpu_flash_fp8.py "$out"
    step 40 $logs/4_paged_fp8.log python -m attnkit.bench.paged fp8 "$out" --decode-only
    step 120 $logs/5_serving.log python -m attnkit.bench.suites --out "$out" serving_features
    step 40 $logs/6_profile.log python -m attnkit.bench.suites --out "$out" decode_profile
    collect $logs "$out/session.log"
fi
