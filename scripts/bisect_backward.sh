#!/usr/bin/env bash
# Which change slowed the backward down between the recordings of 2026-11-22 and 2026-11-23
# (docs/flash_notes.md, "Open: the backward is slower than on 2026-11-22"): the same benchmark, the
# suite attnkit.bench.flash at D = 128 (BISECT_HEAD_DIMS=64,128 for both), fp16, the backward design(s)
# of BISECT_DESIGNS (default two_kernels), N = 1024 and 4096, causal and not, autotuned, run with the
# attnkit package of each commit beside SDPA's cuDNN backend.
#
#   bash scripts/bisect_backward.sh prepare [COMMIT ...]   # here: each commit's attnkit/ into .bisect/<commit>
#   bash scripts/bisect_backward.sh run OUTDIR              # on the GPU machine, with .bisect carried
#
# The GPU machine receives the working tree without git's history, hence the packages exported here
# (.bisect is ignored by git through .git/info/exclude; about 1.5 MB a commit). `run` compiles every
# commit's kernels in parallel first, then times them one commit after another, alone on the GPU, and
# writes OUTDIR/bench_flash_bisect.csv (commit, N, causal, pass, attnkit ms, cuDNN ms, cuDNN / attnkit).
set -u
phase=${1:?prepare or run}
# the layout commit (the kernels as recorded on 2026-11-22), one kernel written once, the model features,
# the shared packed-sequence set-up, the shared dK/dV kernel of both designs, and today's
DEFAULT_COMMITS="7621bbe f0032bd 15b80c4 41e6687 479cea0 HEAD"

if [ "$phase" = prepare ]; then
    shift
    grep -qx '/.bisect/' .git/info/exclude || echo '/.bisect/' >> .git/info/exclude
    for commit in ${@:-$DEFAULT_COMMITS}; do
        name=$(git rev-parse --short "$commit")
        rm -rf ".bisect/$name"; mkdir -p ".bisect/$name"
        git archive "$commit" attnkit | tar -x -C ".bisect/$name"
        echo "$commit -> .bisect/$name"
    done
    exit 0
fi

out=${2:?OUTDIR}; mkdir -p "$out" /tmp/bisect
export PYTHONUNBUFFERED=1 ATTNKIT_AUTOTUNE=1
measure() {   # measure COMMIT_DIR: one CSV row per (N, causal, pass) on stdout, run inside the commit's
    # folder so that its attnkit is the one imported
    (cd "$1" && PYTHONPATH=. python - "$(basename "$1")" <<'EOF'
import sys
from attnkit.bench import flash

import os

dims = [int(d) for d in os.environ.get("BISECT_HEAD_DIMS", "128").split(",")]
only = lambda s: s[0] == "mha" and s[5] in dims and s[7] == "float16" and s[4] in (1024, 4096)  # noqa: E731
for design in os.environ.get("BISECT_DESIGNS", "two_kernels").split(","):
    os.environ["ATTNKIT_FLASH_BACKWARD"] = design      # a commit before the designs ignores it
    rows = flash.run(impls=("attnkit", "sdpa_cudnn"), only=only)
    ms = {(r["impl"], r["D"], r["N"], r["causal"], r["pass"]): r["ms"] for r in rows}
    for (impl, d, n, causal, pass_), t in sorted(ms.items()):
        if impl == "attnkit":
            cudnn = ms[("sdpa_cudnn", d, n, causal, pass_)]
            ratio = cudnn / t if t and cudnn else float("nan")
            print(f"{sys.argv[1]},{design},{d},{n},{causal},{pass_},{t},{cudnn},{ratio}", flush=True)
EOF
    )
}
for dir in .bisect/*/; do   # compile (and autotune, results thrown away) side by side
    (measure "${dir%/}" > /tmp/bisect/warm_$(basename "$dir").log 2>&1) &
done
wait
echo "commit,design,head_dim,n,causal,pass,attnkit_ms,cudnn_ms,vs_cudnn" > "$out/bench_flash_bisect.csv"
for dir in .bisect/*/; do   # timed alone, one commit after another
    measure "${dir%/}" >> "$out/bench_flash_bisect.csv" 2> /tmp/bisect/time_$(basename "$dir").log \
        || tail -n 5 /tmp/bisect/time_$(basename "$dir").log
done
cat "$out/bench_flash_bisect.csv"
