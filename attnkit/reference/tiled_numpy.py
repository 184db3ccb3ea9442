"""Tiled FlashAttention forward in NumPy with a simulated on-chip memory and an HBM traffic counter.

The arithmetic runs in float64; the byte counts are those of a GPU that stores Q, K, V, O and any
intermediate in HBM with ``itemsize`` bytes per element (2 for fp16). Two schedules:

* ``naive_attention``: the standard three kernels. S = Q Kᵀ·scale is written to HBM, read back by the
  softmax, P is written, read back by P·V.
* ``tiled_attention``: FlashAttention's schedule. For each block of b_q query rows, load Q_i once, then
  stream the key/value blocks K_j, V_j through on-chip memory, keeping the partial state (m, ℓ, z) of
  ``attnkit.reference.online_softmax`` on chip; write O_i once. S and P never reach HBM.

Closed forms (checked against the counters in the tests), with T_q = ⌈N_q / b_q⌉:

    naive:  read  e·(N_q·d + N_k·d + 2·N_q·N_k + N_k·dv),  write  e·(2·N_q·N_k + N_q·dv)
    tiled:  read  e·(N_q·d + T_q·N_k·(d + dv)),                       write  e·N_q·dv

With the largest query block that fits in M bytes of on-chip memory, b_q ≈ M / (e·(d + dv + b_k + 2)),
the tiled traffic is Θ(N²·d² / M): the law of the FlashAttention paper.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .online_softmax import block_state, empty_state, finalize, merge


@dataclass
class Traffic:
    """Bytes moved between HBM and the chip, counted per tensor name."""

    itemsize: int = 2
    read: dict = field(default_factory=dict)
    written: dict = field(default_factory=dict)

    def load(self, name: str, array: np.ndarray) -> np.ndarray:
        """Count a read of ``array`` from HBM and return it (a tile now on chip)."""
        self.read[name] = self.read.get(name, 0) + array.size * self.itemsize
        return array

    def store(self, name: str, array: np.ndarray) -> np.ndarray:
        """Count a write of ``array`` to HBM."""
        self.written[name] = self.written.get(name, 0) + array.size * self.itemsize
        return array

    @property
    def bytes_read(self) -> int:
        return sum(self.read.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.written.values())

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written


def _check_inputs(Q, K, V, itemsize):
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    if Q.ndim != 2 or K.ndim != 2 or V.ndim != 2:
        raise ValueError(f"Q, K, V: must be 2-D [N, d], got shapes {Q.shape}, {K.shape}, {V.shape}")
    if Q.shape[1] != K.shape[1]:
        raise ValueError(f"K: must have the head dim of Q ({Q.shape[1]}), got {K.shape[1]}")
    if K.shape[0] != V.shape[0]:
        raise ValueError(f"V: must have one row per key ({K.shape[0]}), got {V.shape[0]}")
    if int(itemsize) != itemsize or itemsize < 1:
        raise ValueError(f"itemsize: must be a positive whole number of bytes, got {itemsize}")
    return Q, K, V


# ------------------------------------------------------------------------------------------ naive
def naive_attention(Q, K, V, *, scale: float | None = None, itemsize: int = 2):
    """Standard attention as three kernels through HBM. Returns (O [N_q, dv], Traffic)."""
    Q, K, V = _check_inputs(Q, K, V, itemsize)
    scale = 1.0 / math.sqrt(Q.shape[1]) if scale is None else scale
    t = Traffic(itemsize)
    # kernel 1: S = Q Kᵀ · scale                                            [N_q, N_k]
    S = t.store("S", t.load("Q", Q) @ t.load("K", K).T * scale)
    # kernel 2: P = softmax(S), row by row
    S = t.load("S", S)
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P = t.store("P", P / P.sum(axis=1, keepdims=True))
    # kernel 3: O = P V                                                     [N_q, dv]
    O = t.store("O", t.load("P", P) @ t.load("V", V))
    return O, t


def naive_traffic_bytes(n_q: int, n_k: int, d: int, dv: int, itemsize: int = 2) -> tuple[int, int]:
    """(bytes read, bytes written) of ``naive_attention``, in closed form."""
    e = itemsize
    return e * (n_q * d + n_k * d + 2 * n_q * n_k + n_k * dv), e * (2 * n_q * n_k + n_q * dv)


# ------------------------------------------------------------------------------------------ tiled
def sram_bytes_needed(block_q: int, block_k: int, d: int, dv: int, itemsize: int = 2) -> int:
    """On-chip bytes for one step: Q_i, K_j, V_j, the score tile S_ij (P_ij overwrites it), z_i, m_i, ℓ_i."""
    return itemsize * (block_q * d + block_k * d + block_k * dv + block_q * block_k + block_q * dv
                       + 2 * block_q)


def blocks_for_sram(sram_bytes: int, d: int, dv: int, itemsize: int = 2) -> tuple[int, int]:
    """(b_q, b_k) for an on-chip memory of ``sram_bytes``: b_k = d keys per tile (or fewer if the
    memory is tiny) and the largest query block that fits beside them."""
    block_k = d
    while block_k >= 1:
        per_row = itemsize * (d + dv + block_k + 2)                 # bytes of one more query row
        fixed = itemsize * block_k * (d + dv)                        # K_j and V_j
        block_q = (sram_bytes - fixed) // per_row
        if block_q >= block_k or (block_k == 1 and block_q >= 1):
            return int(block_q), int(block_k)
        block_k //= 2
    raise ValueError(f"sram_bytes: {sram_bytes} bytes cannot hold one query row and one key/value row "
                     f"(need at least {sram_bytes_needed(1, 1, d, dv, itemsize)} bytes)")


def tiled_traffic_bytes(n_q: int, n_k: int, d: int, dv: int, block_q: int,
                        itemsize: int = 2) -> tuple[int, int]:
    """(bytes read, bytes written) of ``tiled_attention``, in closed form."""
    t_q = math.ceil(n_q / block_q)
    return itemsize * (n_q * d + t_q * n_k * (d + dv)), itemsize * n_q * dv


@dataclass(frozen=True)
class TiledResult:
    out: np.ndarray          # [N_q, dv]
    traffic: Traffic
    block_q: int
    block_k: int
    sram_bytes: int          # the on-chip bytes one step needs (at most the memory given)


def tiled_attention(Q, K, V, *, block_q: int | None = None, block_k: int | None = None,
                    sram_bytes: int | None = None, scale: float | None = None, itemsize: int = 2,
                    on_step=None) -> TiledResult:
    """FlashAttention's forward: exact softmax(Q Kᵀ·scale) V without S or P in HBM.

    Give either the tile sizes (block_q, block_k) or the on-chip memory ``sram_bytes`` (then the tile
    sizes come from ``blocks_for_sram``); with both, the tiles must fit in the memory.
    ``on_step(i, j, state)`` is called after each key/value block j of query block i (for stepping).
    """
    Q, K, V = _check_inputs(Q, K, V, itemsize)
    (n_q, d), (n_k, dv) = Q.shape, V.shape
    if block_q is None and block_k is None:
        if sram_bytes is None:
            raise ValueError("block_q, block_k, sram_bytes: give the tile sizes or the on-chip memory size")
        block_q, block_k = blocks_for_sram(sram_bytes, d, dv, itemsize)
    if block_q is None or block_k is None or block_q < 1 or block_k < 1:
        raise ValueError(f"block_q, block_k: both must be whole numbers ≥ 1, got {block_q}, {block_k}")
    block_q, block_k = min(block_q, max(n_q, 1)), min(block_k, max(n_k, 1))
    need = sram_bytes_needed(block_q, block_k, d, dv, itemsize)
    if sram_bytes is not None and need > sram_bytes:
        raise ValueError(f"sram_bytes: tiles of {block_q}×{block_k} need {need} bytes on chip, "
                         f"more than the {sram_bytes} given")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    t = Traffic(itemsize)
    O = np.zeros((n_q, dv))
    for i, q0 in enumerate(range(0, n_q, block_q)):
        Q_i = t.load("Q", Q[q0:q0 + block_q])                          # [b_q, d]   on chip
        state = empty_state(Q_i.shape[0], dv)                          # m, ℓ, z    on chip
        for j, k0 in enumerate(range(0, n_k, block_k)):
            K_j = t.load("K", K[k0:k0 + block_k])                      # [b_k, d]
            V_j = t.load("V", V[k0:k0 + block_k])                      # [b_k, dv]
            S_ij = Q_i @ K_j.T * scale                                 # [b_q, b_k] on chip only
            state = merge(state, block_state(S_ij, V_j))
            if on_step is not None:
                on_step(i, j, state)
        O[q0:q0 + block_q] = t.store("O", finalize(state))            # [b_q, dv]  written once
    return TiledResult(O, t, block_q, block_k, need)
