"""Fill Triton's on-disk cache for the autotuned benchmark suites, a share at a time, so that the recording
run (alone on the GPU, right after) loads every kernel variant instead of compiling it:

    python scripts/warm_suites.py flash I/N      # share I of N of attnkit.bench.flash's shapes (attnkit only)
    python scripts/warm_suites.py ladder N       # attnkit.bench.flash_ladder at sequence length N

The flash suite is shared out by kernel variant (suite, dtype, head dim, causal), so that no two processes
compile the same one. Timings taken here (side by side with other processes) are thrown away; so are
the autotuner's choices.
A forward at one sequence (N = 16k, batch 1) compiles its own variant: Triton makes an argument equal
to 1 (the batch) a constant.
"""
import sys

from attnkit.bench import flash, flash_ladder


def main(argv) -> int:
    if len(argv) != 2 or argv[0] not in ("flash", "ladder"):
        print(__doc__)
        return 2
    if argv[0] == "flash":
        part, parts = (int(x) for x in argv[1].split("/"))
        variant = lambda shape: (shape[0], shape[7], shape[5], shape[6])   # noqa: E731 (suite, dtype, D, causal)
        variants = sorted({variant(shape) for shape in flash.shapes()})
        rows = flash.run(impls=("attnkit",), only=lambda shape: variants.index(variant(shape)) % parts == part)
    else:
        rows = flash_ladder.run(seq_lens=(int(argv[1]),))
    failed = [r for r in rows if r.get("reason")]
    print(f"{len(rows)} rows, {len(failed)} with a reason", *[r["reason"][:120] for r in failed[:5]], sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
