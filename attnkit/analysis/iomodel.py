"""FLOPs, bytes and arithmetic intensity of attention, and real GPUs' rooflines: the cost model.

Used by lesson 2 (why attention is IO-bound) and reused by lessons 4, 5, 7 and 8 (occupancy, placing
kernels on the roofline). Every number is computed from the shapes; the GPU table holds datasheet peaks,
each with the datasheet it comes from. Naive attention timed against these predictions is
``attnkit.bench.naive``.

    attention_steps(N, d)      -> the steps of standard attention, each with FLOPs and HBM bytes
    fused_attention(N, d)      -> one fused kernel: Q, K, V read once, O written once
    GPUS["H100 SXM"]           -> peak fp16 tensor FLOP/s, HBM bandwidth, on-chip sizes, per-SM limits, source
    occupancy(gpu, ...)        -> programs (thread blocks) per SM, resident warps and the limiting resource
    gpu_from_device()          -> this machine's GPU as a table entry, from torch.cuda.get_device_properties
    roofline_figure(points)    -> matplotlib Figure: the roofs of the GPUs and the points on them
"""
from __future__ import annotations

import math
from dataclasses import dataclass


# ------------------------------------------------------------------------------------------ GPUs
@dataclass(frozen=True)
class GPU:
    name: str
    tensor_tflops: float      # dense fp16 tensor-core peak, 10^12 FLOP/s (no structured sparsity)
    fp32_tflops: float        # non-tensor fp32 peak (elementwise work such as exp runs here)
    hbm_gbs: float            # device-memory bandwidth, 10^9 bytes/s
    memory: str               # type and size of device memory
    sms: int                  # streaming multiprocessors
    smem_kb_per_sm: int       # largest shared memory one SM can give its blocks, KiB
    l2_mb: float              # L2 cache, MB
    source: str               # where the figures come from
    # Per-SM limits of the compute capability (CUDA C++ Programming Guide, "Technical Specifications per
    # Compute Capability"); every GPU here has 65,536 32-bit registers per SM and at most 255 per thread.
    capability: tuple = (9, 0)
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    smem_kb_per_block: int = 227  # largest shared memory one block may opt in to, KiB
    boost_ghz: float = 0.0        # boost clock of the datasheet, GHz
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the roof turns from sloped to flat: peak / bandwidth."""
        return self.tensor_tflops * 1e12 / (self.hbm_gbs * 1e9)

    def attainable_tflops(self, intensity: float) -> float:
        """The roofline: min(peak, intensity × bandwidth), in TFLOP/s."""
        return min(self.tensor_tflops, intensity * self.hbm_gbs * 1e9 / 1e12)


GPUS = {
    "T4": GPU("T4", 65.0, 8.1, 320.0, "16 GB GDDR6", 40, 64, 4.0,
              "NVIDIA T4 Tensor Core GPU datasheet (mixed-precision FP16/FP32 65 TFLOPS, GDDR6 320 GB/s)",
              capability=(7, 5), max_warps_per_sm=32, max_blocks_per_sm=16, smem_kb_per_block=64,
              boost_ghz=1.59),
    "V100 SXM2": GPU("V100 SXM2", 125.0, 15.7, 900.0, "16/32 GB HBM2", 80, 96, 6.0,
                     "NVIDIA Tesla V100 GPU datasheet (SXM2: tensor 125 TFLOPS, HBM2 900 GB/s)",
                     capability=(7, 0), max_warps_per_sm=64, max_blocks_per_sm=32, smem_kb_per_block=96,
                     boost_ghz=1.53),
    "L4": GPU("L4", 121.0, 30.3, 300.0, "24 GB GDDR6", 58, 100, 48.0,
              "NVIDIA L4 Tensor Core GPU datasheet (FP16 tensor 242 TFLOPS with sparsity, so 121 dense; "
              "GDDR6 300 GB/s)",
              capability=(8, 9), max_warps_per_sm=48, max_blocks_per_sm=24, smem_kb_per_block=99,
              boost_ghz=2.04),
    "A100 SXM 40GB": GPU("A100 SXM 40GB", 312.0, 19.5, 1555.0, "40 GB HBM2", 108, 164, 40.0,
                         "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM: FP16 tensor 312 TFLOPS dense, "
                         "HBM2 1,555 GB/s)",
                         capability=(8, 0), max_warps_per_sm=64, max_blocks_per_sm=32, smem_kb_per_block=163,
                         boost_ghz=1.41),
    "A100 SXM 80GB": GPU("A100 SXM 80GB", 312.0, 19.5, 2039.0, "80 GB HBM2e", 108, 164, 40.0,
                         "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB: FP16 tensor 312 TFLOPS dense, "
                         "HBM2e 2,039 GB/s)",
                         capability=(8, 0), max_warps_per_sm=64, max_blocks_per_sm=32, smem_kb_per_block=163,
                         boost_ghz=1.41),
    "H100 SXM": GPU("H100 SXM", 989.5, 67.0, 3350.0, "80 GB HBM3", 132, 228, 50.0,
                    "NVIDIA H100 Tensor Core GPU datasheet (SXM: FP16 tensor 1,979 TFLOPS with sparsity, "
                    "so 989.5 dense; HBM3 3.35 TB/s)",
                    capability=(9, 0), max_warps_per_sm=64, max_blocks_per_sm=32, smem_kb_per_block=227,
                    boost_ghz=1.98),
}
# The roofline plots of lessons 2, 5 and 8: one GPU per generation (the A100 40GB and the L4 are in the
# table for lesson 4's comparison of the memory levels).
ROOFLINE_GPUS = ("T4", "V100 SXM2", "A100 SXM 80GB", "H100 SXM")

# Occupancy: how the SM's resources are handed out (CUDA occupancy calculator; CUDA C++ Programming Guide).
REGISTER_UNIT = 256            # registers are given to a warp in units of 256
SMEM_RESERVED_PER_BLOCK = 1024  # bytes of shared memory the system keeps per block (compute capability >= 8.0)
SMEM_UNIT = 128                # shared memory is given to a block in units of 128 bytes


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int          # programs resident on one SM at once
    warps_per_sm: int
    fraction: float             # resident warps / the SM's maximum warps
    limits: dict                # blocks per SM that each resource alone would allow
    limited_by: str             # the resource that allows the fewest


def occupancy(gpu: GPU, registers_per_thread: int, threads_per_block: int, smem_bytes_per_block: int) -> Occupancy:
    """How many programs (thread blocks) of a kernel fit on one SM of ``gpu`` at once, and which resource
    decides: registers (per warp, rounded up to REGISTER_UNIT), shared memory (per block, plus the
    system's reserve, rounded up to SMEM_UNIT), the SM's warp slots and its block slots."""
    for name, value, low in (("registers_per_thread", registers_per_thread, 1),
                             ("threads_per_block", threads_per_block, 1),
                             ("smem_bytes_per_block", smem_bytes_per_block, 0)):
        if int(value) != value or value < low:
            raise ValueError(f"{name}: must be a whole number ≥ {low}, got {value!r}")
    if registers_per_thread > gpu.max_registers_per_thread:
        raise ValueError(f"registers_per_thread: at most {gpu.max_registers_per_thread} on the {gpu.name}, "
                         f"got {registers_per_thread}")
    if threads_per_block > 1024:
        raise ValueError(f"threads_per_block: at most 1024, got {threads_per_block}")
    if smem_bytes_per_block > gpu.smem_kb_per_block * 1024:
        raise ValueError(f"smem_bytes_per_block: at most {gpu.smem_kb_per_block} KiB a block on the {gpu.name}, "
                         f"got {smem_bytes_per_block / 1024:g} KiB")
    warps = math.ceil(threads_per_block / 32)
    regs_per_warp = math.ceil(registers_per_thread * 32 / REGISTER_UNIT) * REGISTER_UNIT
    reserve = SMEM_RESERVED_PER_BLOCK if gpu.capability >= (8, 0) else 0
    smem = math.ceil((smem_bytes_per_block + reserve) / SMEM_UNIT) * SMEM_UNIT
    limits = {"registers": gpu.registers_per_sm // (regs_per_warp * warps),
              "shared memory": (gpu.smem_kb_per_sm * 1024) // smem if smem_bytes_per_block else gpu.max_blocks_per_sm,
              "warp slots": gpu.max_warps_per_sm // warps,
              "block slots": gpu.max_blocks_per_sm}
    limited_by = min(limits, key=limits.get)
    blocks = limits[limited_by]
    return Occupancy(blocks, blocks * warps, blocks * warps / gpu.max_warps_per_sm, limits, limited_by)



def gpu_from_device(index: int = 0) -> GPU:
    """This machine's CUDA GPU ``index`` as a GPU record: what ``torch.cuda.get_device_properties`` reports
    (name, compute capability, SMs, warps and shared memory per SM, L2), the rest (peaks, block slots) from
    the table's entry of the same compute capability (the H100's when none matches)."""
    import dataclasses

    import torch

    if not torch.cuda.is_available():
        raise ValueError("index: no CUDA GPU on this machine; use a GPUS entry instead")
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"index: must be in [0, {torch.cuda.device_count()}), got {index}")
    p = torch.cuda.get_device_properties(index)
    cc = (p.major, p.minor)
    like = next((g for g in GPUS.values() if g.capability == cc), GPUS["H100 SXM"])
    smem = getattr(p, "shared_memory_per_multiprocessor", like.smem_kb_per_sm * 1024)
    return dataclasses.replace(like, name=p.name, capability=cc, sms=p.multi_processor_count,
                               max_warps_per_sm=p.max_threads_per_multi_processor // p.warp_size,
                               smem_kb_per_sm=smem // 1024,
                               l2_mb=getattr(p, "L2_cache_size", int(like.l2_mb * 1e6)) / 1e6,
                               memory=f"{p.total_memory / 1e9:.0f} GB",
                               source="torch.cuda.get_device_properties (peaks from the table's "
                                      f"{like.name} entry)")

# ------------------------------------------------------------------------------ steps of attention
@dataclass(frozen=True)
class Step:
    name: str
    flops: float
    bytes_read: float
    bytes_written: float

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte of HBM traffic."""
        return self.flops / self.bytes

    def time_bound_s(self, gpu: GPU) -> float:
        """The roofline's lower bound on the time: max(FLOPs / peak, bytes / bandwidth)."""
        return max(self.flops / (gpu.tensor_tflops * 1e12), self.bytes / (gpu.hbm_gbs * 1e9))


def _check_sizes(N, d, itemsize):
    for name, value in (("N", N), ("d", d), ("itemsize", itemsize)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name}: must be a whole number ≥ 1, got {value!r}")


def attention_steps(N: int, d: int, *, itemsize: int = 2, softmax_flops: int = 5,
                    separate_scale: bool = True) -> list[Step]:
    """The kernels of standard attention for one head (N queries, N keys, head dim d = d_v).

    Each kernel reads its inputs from HBM and writes its output there (``itemsize`` bytes per element).
    FLOPs: a multiply-add counts 2; softmax counts ``softmax_flops`` per score (5: max, subtract, exp,
    sum, divide; the IO chapter of docs/references.md counts 2: exp and divide); scale-and-mask counts 1
    (the multiply). With ``separate_scale=False`` the scale is folded into QKᵀ (as the profiling post's
    traffic table does).
    """
    _check_sizes(N, d, itemsize)
    if softmax_flops < 0:
        raise ValueError(f"softmax_flops: must be ≥ 0, got {softmax_flops}")
    e, nn, nd = itemsize, N * N, N * d
    steps = [Step("QKᵀ", 2 * nn * d, e * 2 * nd, e * nn)]
    if separate_scale:
        steps.append(Step("scale+mask", nn, e * nn, e * nn))
    steps.append(Step("softmax", softmax_flops * nn, e * nn, e * nn))
    steps.append(Step("P·V", 2 * nn * d, e * (nn + nd), e * nd))
    return steps


def fused_attention(N: int, d: int, *, itemsize: int = 2, softmax_flops: int = 5) -> Step:
    """One fused kernel (FlashAttention) at its floor: Q, K, V read once, O written once."""
    _check_sizes(N, d, itemsize)
    return Step("fused", 4 * N * N * d + softmax_flops * N * N, itemsize * 3 * N * d, itemsize * N * d)


def attention_flops(N: int, d: int, softmax_flops: int = 2) -> int:
    """4N²d + softmax_flops·N²: the two products plus the softmax (the IO chapter's 4N²d + 2N²)."""
    return 4 * N * N * d + softmax_flops * N * N


# ------------------------------------------------------------------------------------ the figures
def roofline_figure(points=(), gpus=None, *, title: str = "Roofline: fp16 tensor peak and HBM bandwidth",
                    xlim=(0.1, 1e4)):
    """A log-log roofline of ``gpus`` (names in GPUS, default ROOFLINE_GPUS) with ``points`` on it.

    points: (label, intensity) pairs, drawn as vertical lines with their attainable rate on the H100
    roof marked; or (label, intensity, tflops) triples, drawn as measured points.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(ROOFLINE_GPUS) if gpus is None else list(gpus)
    for n in names:
        if n not in GPUS:
            raise ValueError(f"gpus: unknown GPU {n!r}; known: {sorted(GPUS)}")
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    x = np.logspace(math.log10(xlim[0]), math.log10(xlim[1]), 400)
    for i, n in enumerate(names):
        g = GPUS[n]
        ax.loglog(x, [g.attainable_tflops(v) for v in x], color=f"C{i}", lw=2,
                  label=f"{n}: {g.tensor_tflops:g} TFLOP/s, {g.hbm_gbs:,.0f} GB/s (ridge {g.ridge:.0f})")
    top = GPUS[names[-1]]
    merged = {}                                   # points of equal intensity share one marker and label
    for p in points:
        if len(p) < 3 and p[1] in merged:
            merged[p[1]] = (merged[p[1]][0] + ", " + p[0], p[1])
        else:
            merged[p[1] if len(p) < 3 else (p[1], p[2])] = tuple(p)
    for j, p in enumerate(merged.values()):
        label, intensity = p[0].replace("ᵀ", "$^T$"), p[1]
        if intensity <= 0:
            raise ValueError(f"points: intensity of {label!r} must be > 0, got {intensity}")
        if len(p) >= 3:
            ax.plot(intensity, p[2], "o", color="k", ms=6)
            ax.annotate(label, (intensity, p[2]), textcoords="offset points", xytext=(5, -12), fontsize=8)
        else:
            ax.axvline(intensity, color="gray", lw=0.8, ls=":")
            y = top.attainable_tflops(intensity)
            ax.plot(intensity, y, "D", color="k", ms=5)
            high = y > 300                        # near the top: label below the point, clear of the title
            value = f"{intensity:,.0f}" if intensity >= 100 else f"{intensity:.3g}"
            ax.annotate(f"{label}\n{value} FLOP/B", (intensity, y), textcoords="offset points",
                        xytext=(4, -30 if high else 6 + 14 * (j % 2)), fontsize=8)
    ax.set_xlim(*xlim)
    ax.set_ylim(0.1, 3000)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of HBM traffic)")
    ax.set_ylabel("attainable rate (TFLOP/s, 10¹² FLOP/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right")
    fig.tight_layout()
    return fig


def roofline_attention_figure(N: int = 4096, d: int = 128):
    """The steps of standard attention (fp16, one head) and the fused kernel on four GPUs' roofs."""
    pts = [(s.name, s.intensity) for s in attention_steps(N, d)] + [("fused (floor)", fused_attention(N, d).intensity)]
    return roofline_figure(pts, title=f"Attention steps on the roofline (N={N}, d={d}, fp16)")


# The H100 SXM's memory levels: capacity of the whole GPU and bandwidth (NVIDIA H100 Tensor Core GPU
# datasheet and architecture whitepaper). Shared memory's bandwidth is derived: each SM's shared memory
# delivers 128 bytes per clock (32 banks of 4 bytes), × 132 SMs × the 1.98 GHz boost clock. NVIDIA
# publishes no bandwidth for the register file or the L2 cache: they are left out of the bandwidth panel.
H100_BOOST_GHZ = 1.98
SMEM_BYTES_PER_CLOCK = 128

HIERARCHY_H100 = (
    # level, capacity in bytes, what the capacity is, bandwidth in bytes/s (None: not published)
    ("registers", 132 * 256 * 1024, "256 KiB per SM × 132 SMs", None),
    ("shared memory / L1", 132 * 256 * 1024, "256 KiB per SM × 132 SMs (up to 228 KiB as shared memory)",
     132 * SMEM_BYTES_PER_CLOCK * H100_BOOST_GHZ * 1e9),
    ("L2 cache", 50 * 1024**2, "50 MB, shared by all SMs", None),
    ("HBM3", 80 * 1000**3, "80 GB", 3.35e12),
    ("host DRAM over PCIe 5.0 x16", None, "the CPU's memory, beyond the GPU", 64e9),
)


def smem_bandwidth(gpu: GPU, boost_ghz: float | None = None) -> float:
    """Aggregate shared-memory bandwidth in bytes/s: SMs × 128 bytes per clock × boost clock (default the
    GPU's own boost clock)."""
    return gpu.sms * SMEM_BYTES_PER_CLOCK * (gpu.boost_ghz if boost_ghz is None else boost_ghz) * 1e9


def memory_hierarchy_figure():
    """The H100's memory levels: capacity (left) and bandwidth (right), both on log axes."""
    import matplotlib.pyplot as plt

    fig, (cap, bw) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    names = [lvl for lvl, *_ in HIERARCHY_H100]
    colors = ["#2a9d8f", "#2a9d8f", "#e9c46a", "#e76f51", "#8d99ae"]
    for i, (_, size, _note, rate) in enumerate(HIERARCHY_H100):
        if size:
            cap.barh(i, size, color=colors[i])
            cap.text(size * 1.4, i, f"{size / 2**20:,.0f} MiB" if size < 1e9 else f"{size / 1e9:.0f} GB",
                     va="center", fontsize=8)
        if rate:
            bw.barh(i, rate / 1e12, color=colors[i])
            bw.text(rate / 1e12 * 1.2, i, f"{rate / 1e12:.3g} TB/s", va="center", fontsize=8)
        else:
            bw.text(0.012, i, "not published", va="center", fontsize=8, color="gray")
    cap.set_yticks(range(len(names)), names)
    cap.set_xscale("log")
    cap.set_xlim(1e6, 1e13)
    cap.invert_yaxis()
    cap.set_xlabel("capacity of the whole GPU (bytes, log scale)")
    cap.set_ylabel("memory level")
    bw.set_xscale("log")
    bw.set_xlim(0.01, 300)
    bw.set_xlabel("bandwidth (TB/s, log scale)")
    for ax in (cap, bw):
        ax.axhline(2.5, color="k", lw=0.8, ls="--")
        ax.axhline(3.5, color="k", lw=0.8, ls=":")
    cap.text(3e11, 2.45, "chip boundary", fontsize=8, va="bottom")
    cap.text(3e11, 3.45, "GPU boundary", fontsize=8, va="bottom")
    fig.suptitle("H100 SXM memory hierarchy: each level down is larger and slower")
    fig.tight_layout()
    return fig
