"""Run the fresh wrong answers (and the alternative correct answers) of labs 01-10 through the labs' checks.

    .venv/bin/python tests/fresh_mutants/run_fresh.py [LAB ...] [--seeds N] [--json PATH] [--dir DIR]

Each wrong answer is run through its exercise's check on seeds 0..19 (0..4 for the Triton labs 04, 05,
06, 08 and the multi-process lab 10); each correct answer on the same seeds. Prints, per lab, how many
wrong answers were accepted on at least one seed (with their names and seeds) and whether every
correct answer passed on every seed. Lab 05's three checks grade one kernel: a wrong kernel counts as
accepted on a seed when all three checks pass it. Runs one check at a time (the checks fork their own
child processes). --dir names another folder of labNN_fresh.py files (e.g. tests/fresh_mutants/round2)."""
import argparse
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TRITON_INTERPRET", "1")

SLOW = {"04", "05", "06", "08", "10"}

# lab -> exercise key in labNN_fresh.WRONG/CORRECT -> the check functions (all must pass) in labchecks.labNN
CHECKS = {
    "01": {"by_hand": ["check_by_hand"], "scores": ["check_scores"], "softmax": ["check_softmax"],
           "attention": ["check_attention"], "positions": ["check_positions"]},
    "02": {"matmul_cost": ["check_matmul_cost"], "flash_forward_cost": ["check_flash_forward_cost"],
           "decode_cost": ["check_decode_cost"], "roofline": ["check_roofline"], "prediction": ["check_prediction"]},
    "03": {"online_softmax": ["check_online_softmax"], "merge": ["check_merge"],
           "tiled_attention": ["check_tiled_attention"]},
    "04": {"scaled_add": ["check_scaled_add"], "block_max": ["check_block_max"],
           "affine_columns": ["check_affine_columns"], "row_sums": ["check_row_sums"], "matmul": ["check_matmul"],
           "prediction": ["check_prediction"], "causal_softmax": ["check_causal_softmax"],
           "row_logsumexp": ["check_row_logsumexp"], "softmax_weighted_sum": ["check_softmax_weighted_sum"]},
    "05": {"forward": ["check_forward", "check_causal", "check_gqa"],
           "causal": ["check_forward", "check_causal", "check_gqa"],
           "gqa": ["check_forward", "check_causal", "check_gqa"]},
    "06": {"row_term": ["check_row_term"], "dkdv": ["check_dkdv"], "dq": ["check_dq"],
           "prediction": ["check_prediction"]},
    "07": {"cache_bytes": ["check_cache_bytes"], "max_sequences": ["check_max_sequences"], "rope": ["check_rope"],
           "rope_append": ["check_rope_append"]},
    "08": {"slots": ["check_slots"], "pool": ["check_pool"], "paged_decode": ["check_paged_decode"],
           "merge": ["check_merge"]},
    "09": {"pages_needed": ["check_pages_needed"], "grow": ["check_grow"], "admit": ["check_admit"],
           "scheduler": ["check_scheduler"], "prediction": ["check_prediction"]},
    "10": {"zigzag": ["check_zigzag_chunks"], "ratio": ["check_predicted_work_ratio"],
           "merge": ["check_merge_blocks"], "ring": ["check_ring_forward"],
           "step_transfer": ["check_step_transfer_us"]},
}


def first_line(result) -> str:
    return str(getattr(result, "report", result)).strip().splitlines()[0][:160] if result is not None else ""


def passes(checks, fn, seed):
    """(all checks passed, first report line of the first check that did not pass)."""
    for check in checks:
        try:
            result = check(fn, seed=seed)
        except Exception as exc:   # a check that raises is reported, not counted as a pass
            return False, f"check raised {type(exc).__name__}: {exc}"[:160]
        if not result.passed:
            return False, first_line(result)
    return True, ""


def run_lab(lab, n_seeds=None, verbose=False, only=None):
    module = importlib.import_module(f"lab{lab}_fresh")
    labmod = importlib.import_module(f"attnkit.classroom.labchecks.lab{lab}")
    seeds = range(n_seeds if n_seeds is not None else (5 if lab in SLOW else 20))
    out = {"lab": lab, "seeds": len(seeds), "wrong": [], "correct": []}
    done = set()                 # (function, checks) already run: lab 05's three exercises share checks
    for kind, table in (("wrong", module.WRONG), ("correct", module.CORRECT)):
        for exercise, fns in table.items():
            checks = [getattr(labmod, name) for name in CHECKS[lab][exercise]]
            for fn in fns:
                if only and fn.__name__ not in only:
                    continue
                if (fn, tuple(CHECKS[lab][exercise])) in done:
                    continue
                done.add((fn, tuple(CHECKS[lab][exercise])))
                start = time.perf_counter()
                accepted, rejected_by = [], ""
                for seed in seeds:
                    ok, why = passes(checks, fn, seed)
                    if ok:
                        accepted.append(seed)
                    elif not rejected_by:
                        rejected_by = why
                row = {"exercise": exercise, "name": fn.__name__, "accepted_seeds": accepted,
                       "first_rejection": rejected_by, "seconds": round(time.perf_counter() - start, 1)}
                out[kind].append(row)
                if verbose:
                    print(f"  lab {lab} {kind:7s} {exercise:20s} {fn.__name__:34s} accepted on "
                          f"{len(accepted)}/{len(seeds)} seeds {accepted if accepted else ''} "
                          f"({row['seconds']} s) {rejected_by[:90]}", flush=True)
    return out


def summary(res) -> str:
    n = len(res["wrong"])
    through = [r for r in res["wrong"] if r["accepted_seeds"]]
    bad_correct = [r for r in res["correct"] if len(r["accepted_seeds"]) < res["seeds"]]
    lines = [f"lab {res['lab']}: {len(through)} of {n} fresh wrong answers accepted on at least one of "
             f"{res['seeds']} seeds; correct answers: {len(res['correct']) - len(bad_correct)} of "
             f"{len(res['correct'])} passed on every seed"]
    for r in through:
        lines.append(f"   got through: {r['exercise']}/{r['name']} on seeds {r['accepted_seeds']}")
    for r in bad_correct:
        lines.append(f"   correct answer rejected: {r['exercise']}/{r['name']} passed only on seeds "
                     f"{r['accepted_seeds']}: {r['first_rejection']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labs", nargs="*", default=sorted(CHECKS), help="lab numbers, e.g. 01 04")
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 20, or 5 for slow labs)")
    parser.add_argument("--json", default=None, help="append each lab's results to this JSON-lines file")
    parser.add_argument("--dir", default=None, help="folder of the labNN_fresh.py files (default: this one)")
    parser.add_argument("--only", default=None, help="comma-separated names of the answers to run (default: all)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per answer as it finishes")
    args = parser.parse_args(argv)
    if args.dir:
        sys.path.insert(0, os.path.abspath(args.dir))
    for lab in args.labs:
        lab = f"{int(lab):02d}"
        res = run_lab(lab, args.seeds, args.verbose, set(args.only.split(",")) if args.only else None)
        print(summary(res), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
