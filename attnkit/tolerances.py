"""Tolerances by dtype, in one place.

Every comparison in the course, kernel tests and lab checks alike, measures the relative error
‖out − ref‖ / ‖ref‖ against a float64 reference and compares it with the bound for the dtype the
computation ran in.
"""
from __future__ import annotations

import math

import numpy as np

# Relative-error bounds (‖out − ref‖ / ‖ref‖). fp32 matrix products on a GPU run on tensor cores in
# tf32 (10 mantissa bits) unless asked otherwise, hence the separate "tf32" entry.
REL_TOL = {
    "float64": 1e-12,
    "float32": 1e-5,
    "tf32": 2e-3,          # the same 10 stored mantissa bits as fp16
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
}


def dtype_name(dtype) -> str:
    """'float16' for torch.float16, np.float16 or 'float16'."""
    name = str(dtype).replace("torch.", "")
    aliases = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
               "fp16": "float16", "fp32": "float32", "fp64": "float64"}
    name = aliases.get(name, name)
    if name not in REL_TOL:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in REL_TOL:
        raise ValueError(f"dtype: no tolerance for {dtype!r}; known: {sorted(REL_TOL)}")
    return name


def tolerance(dtype, device: str = "cpu") -> float:
    """The relative-error bound for a computation in ``dtype`` on ``device`` ("cpu" or "cuda").

    On CUDA, float32 matrix products in Triton use tf32 tensor cores, so float32 gets the tf32 bound.
    """
    name = dtype_name(dtype)
    if name == "float32" and str(device).startswith("cuda"):
        return REL_TOL["tf32"]
    return REL_TOL[name]


def _as_float64(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when out holds NaN or inf, or when the shapes differ."""
    out64, ref64 = _as_float64(out), _as_float64(ref)
    if out64.shape != ref64.shape or not np.all(np.isfinite(out64)):
        return math.inf
    norm = np.linalg.norm(ref64)
    diff = np.linalg.norm(out64 - ref64)
    return float(diff / norm) if norm > 0 else float(diff)


def assert_close(out, ref, dtype, device: str = "cpu", what: str = "output") -> float:
    """Raise AssertionError naming ``what`` when ``out`` is further from ``ref`` than the dtype allows."""
    err = rel_error(out, ref)
    bound = tolerance(dtype, device)
    if not err <= bound:
        raise AssertionError(f"{what}: relative error {err:.3e} exceeds the {dtype_name(dtype)} bound {bound:.1e}")
    return err


# A check's bound, the same on a CPU and a GPU: the dtype the kernel computes in decides it, not the
# device. fp16 and bf16 inputs with fp32 accumulation get their dtype's bound; float32 inputs get
# float32's, or tf32's when their products run through tl.dot (tensor cores read fp32 as tf32 on a
# GPU; the interpreter's exact product is held to the same bound, so both devices accept the same work).
def check_tolerance(dtype, *, dot: bool = False) -> float:
    """The relative-error bound of a lab check for a kernel computing in ``dtype`` (see above)."""
    name = dtype_name(dtype)
    if name == "float32" and dot:
        return REL_TOL["tf32"]
    return REL_TOL[name]


class WithMagnitude(np.ndarray):
    """A float64 reference that carries ``magnitude``: the same computation on the absolute values of
    its terms (for a product A·B, |A|·|B|), the scale of the rounding error any correct order of
    summation can make (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.5)."""

    magnitude: np.ndarray


def with_magnitude(ref, magnitude) -> WithMagnitude:
    """``ref`` (float64) that carries ``magnitude`` (its shape) for ``componentwise_error``."""
    ref64, mag64 = _as_float64(ref), np.abs(_as_float64(magnitude))
    if ref64.shape != mag64.shape:
        raise ValueError(f"magnitude: expected shape {ref64.shape}, got {mag64.shape}")
    out = ref64.view(WithMagnitude)
    out.magnitude = mag64
    return out


def componentwise_error(out, ref, magnitude) -> float:
    """The largest, over rows (all axes but the last), of ‖out_r − ref_r‖ / ‖magnitude_r‖.

    Each row is held to the scale of its own terms: a row whose terms cancel to a tiny result (a
    gradient of a row that sees one key) is not judged by a pure relative error, and an error confined
    to one row is not diluted by the others. A row with magnitude 0 must come out exact. inf when
    ``out`` holds NaN or inf, or the shapes differ.
    """
    out64, ref64, mag64 = _as_float64(out), _as_float64(ref), np.abs(_as_float64(magnitude))
    if out64.shape != ref64.shape or mag64.shape != ref64.shape or not np.all(np.isfinite(out64)):
        return math.inf
    if out64.ndim == 0:
        out64, ref64, mag64 = (a.reshape(1) for a in (out64, ref64, mag64))
    diff = np.linalg.norm((out64 - ref64).reshape(-1, out64.shape[-1]), axis=1)
    scale = np.linalg.norm(mag64.reshape(-1, out64.shape[-1]), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff > 0, np.inf, 0.0))
    return float(ratio.max()) if ratio.size else 0.0
