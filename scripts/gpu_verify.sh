#!/usr/bin/env bash
# After a change to the labs, the grader or the kernels: every check that needs a GPU, in one run.
#
#   bash scripts/gpu_verify.sh OUTDIR [SECONDS]
#
# 1. the course installed (editable) in the interpreter the grading steps run (`python -I`), with the wheels
#    of WHEELS (a folder) where the machine lacks nbval, nbclient, ipywidgets, pytest-xdist or pytest-timeout;
# 2. the kernel leaderboard on the solutions and the slower fixtures, alone on the machine (its timings are
#    the host's too): OUTDIR/leaderboard/ (bench_leaderboard.csv, leaderboard.md, grades/);
# 3. then, side by side: the solutions under nbval (GPU 0), the fresh wrong answers of the Triton labs
#    (rounds 6, 5, 4 and 3, compiled, and lab 04 interpreted: GPU 0 after nbval), and the kernels' GPU tests over every GPU (scripts/gpu_tests.sh).
# SECONDS (default 570) bounds the whole run; each step's log is in OUTDIR and its last lines are printed.
set -u
out=${1:?OUTDIR}; limit=${2:-570}
mkdir -p "$out"; export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
started=$(date +%s)
left() { echo $(( limit - ($(date +%s) - started) )); }

{
  if [ -n "${WHEELS:-}" ]; then
    $PY -m pip install -q --no-index --find-links "$WHEELS" nbval ipywidgets nbclient pytest-xdist pytest-timeout
  fi
  $PY -m pip install -q --no-deps --no-build-isolation -e .
} > "$out/install.log" 2>&1
echo "install: exit $?"

CUDA_VISIBLE_DEVICES=0 timeout $(( $(left) / 3 )) $PY -m attnkit.classroom.grading leaderboard --jobs 12 --repeats 3 \
  --out "$out/leaderboard" solutions/lab0[4568]_*.ipynb tests/fixtures/leaderboard/*.ipynb > "$out/leaderboard.log" 2>&1
echo "leaderboard: exit $? after $(( $(date +%s) - started )) s"

(
  CUDA_VISIBLE_DEVICES=0 timeout $(( $(left) - 30 )) $PY -m pytest -q -p no:cacheprovider --nbval -n 4 --dist loadfile solutions \
    > "$out/nbval_solutions.log" 2>&1
  echo "nbval solutions: exit $?" >> "$out/nbval_solutions.log"
  # the newest rounds first, compiled (run_fresh.py interprets unless told otherwise), then lab 04 interpreted
  # on the GPU machine; as far as the time allows
  for round in round6 round5 round4 round3; do
    for run in "0 04" "0 05" "0 06" "0 07" "0 08" "1 04"; do
      set -- $run
      [ "$(left)" -gt 60 ] || break 2
      echo "$round TRITON_INTERPRET=$1" >> "$out/fresh.log"
      CUDA_VISIBLE_DEVICES=0 TRITON_INTERPRET=$1 timeout $(( $(left) - 30 )) $PY tests/fresh_mutants/run_fresh.py \
        $2 --dir tests/fresh_mutants/$round >> "$out/fresh.log" 2>&1
    done
  done
) &
PYTHON=$PY bash scripts/gpu_tests.sh "$out/gpu_tests" $(( $(left) - 20 )) > "$out/gpu_tests.log" 2>&1 &
wait

for log in leaderboard nbval_solutions fresh gpu_tests; do
  echo "== $out/$log.log"; tail -n 12 "$out/$log.log" 2>/dev/null
done
