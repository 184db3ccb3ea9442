"""Prove every wrong answer of round 6 wrong: run its WITNESS call on it and on the solution, and report
the ones whose results agree (an accidentally correct answer must be dropped).

    .venv/bin/python tests/fresh_mutants/round6/verify.py [LAB ...]
"""
import importlib
import math
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import warnings  # noqa: E402

import numpy as np  # noqa: E402

warnings.simplefilter("ignore")


def _plain(x):
    """Nested lists/tuples of floats from tensors, arrays, numbers and plain objects."""
    if hasattr(x, "detach"):
        return x.detach().double().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x.astype(np.float64) if x.dtype != object else x
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def same(a, b):
    a, b = _plain(a), _plain(b)
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return False
        return bool(np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def verify(lab):
    module = importlib.import_module(f"lab{lab}_fresh")
    bad = []
    n = 0
    for exercise, fns in module.WRONG.items():
        ref = module.SOLUTION[exercise]
        for fn in fns:
            n += 1
            witness = module.WITNESS.get(fn.__name__)
            if witness is None:
                bad.append(f"{fn.__name__}: no witness")
                continue
            want = witness(ref)
            try:
                got = witness(fn)
            except Exception as exc:  # a wrong answer that raises on a valid input differs
                print(f"  lab {lab} {fn.__name__:40s} raises {type(exc).__name__}: {str(exc)[:60]}")
                continue
            if same(got, want):
                bad.append(f"{fn.__name__}: agrees with the solution on its witness")
            else:
                print(f"  lab {lab} {fn.__name__:40s} differs", flush=True)
    print(f"lab {lab}: {n} wrong answers, {n - len(bad)} shown to differ")
    for line in bad:
        print("  NOT SHOWN:", line)
    return not bad


if __name__ == "__main__":
    labs = [f"{int(x):02d}" for x in sys.argv[1:]] or [f"{i:02d}" for i in range(1, 11)]
    ok = all([verify(lab) for lab in labs])
    sys.exit(0 if ok else 1)
