"""The course's table of contents and its home, defined once.

The README's table, every notebook's "Open in Colab" badge and Colab install cell, and the site are
made from (and tested against) what is written here.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import __version__

# Where the course lives, and the release its notebooks link to and install: the git tag of this
# version of the package (``attnkit.__version__``, which pyproject.toml reads too). Every address a
# notebook shows or prints is made from these: Colab badges, the setup cell's install line, the
# glossary links, the notes of skipped cells, and (checked by tests/integration/test_environment.py) the README,
# CITATION.cff and pyproject.toml. A fork changes REPO_URL and runs `make headers`; a release is made
# as docs/instructor_guide.md ("Releases and Colab") says.
REPO_URL = "https://github.com/attnkit/attention-kernels-course"
RELEASE = f"v{__version__}"
REF = RELEASE             # what every address points into: never a branch, whose content moves
BRANCH = REF              # the older name of REF


@dataclass(frozen=True)
class Lesson:
    number: int
    slug: str        # notebooks/{number:02d}_{slug}.ipynb
    title: str
    has_lab: bool
    minutes: int = 0                      # expected time to read and run the lesson (its lab not included)
    objectives: tuple[str, ...] = ()      # "After this lesson you can ..." items
    prerequisites: str = ""               # what to know first
    questions: tuple[str, ...] = ()       # closing questions; answers in docs/instructor_guide.md

    @property
    def heading(self) -> str:
        """The lesson's title as every page shows it: "Lesson N · Title"."""
        return f"Lesson {self.number} · {self.title}"

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.number:02d}_{self.slug}.ipynb"

    @property
    def lab(self) -> str | None:
        return f"labs/lab{self.number:02d}_{self.slug}.ipynb" if self.has_lab else None

    @property
    def solution(self) -> str | None:
        return f"solutions/lab{self.number:02d}_{self.slug}.ipynb" if self.has_lab else None


@dataclass(frozen=True)
class DeepDive(Lesson):
    """An optional notebook beside lesson ``number``: how its kernel was tuned and measured.

    A lesson's main line teaches the idea; the engineering behind its recorded numbers (host paths,
    spreads, sweeps, profiles, compiler output) lives here, linked from the lesson. No lab.
    """
    has_lab: bool = False

    @property
    def heading(self) -> str:
        return f"Deep dive {self.number} · {self.title}"

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.number:02d}b_{self.slug}.ipynb"


LESSONS = (
    Lesson(0, "setup", "Setup: what runs where", False, minutes=35,
           objectives=("say where this machine runs the course's kernels (GPU, Triton's interpreter, or not at all)",
                       "run a first Triton kernel and check it against PyTorch",
                       "tell apart the architecture (GQA), the kernel (FlashAttention) and the cache layout (pages)"),
           prerequisites="Python and NumPy; a browser with Colab or a machine with Python 3.11+",
           questions=("What does `TRITON_INTERPRET=1` change about how a kernel runs, and why is it set "
                      "before `import triton`?",
                      "Why can a bf16 kernel not compile on a T4 while `torch.cuda.is_bf16_supported()` says True?",
                      "GQA, FlashAttention and paged attention: which changes the model's weights, which the kernel, "
                      "which only where K and V live?")),
    Lesson(1, "attention_by_hand", "Attention by hand", True, minutes=65,
           objectives=(r"compute $S = QK^\top/\sqrt{d}$, $P = \mathrm{softmax}(S)$ and $O = PV$ for a 4×4 "
                       "example by hand, to 4 decimals",
                       r"explain why scores are scaled by $\sqrt{d}$",
                       "apply a causal mask and split attention into heads",
                       "build sinusoidal position encodings"),
           prerequisites="matrix products and the exponential function; Python and NumPy",
           questions=("For the 4×4 example, why must rounding wait until O is computed?",
                      "If d grows from 16 to 256 and scores are not scaled, what happens to the softmax rows, and why?",
                      "A causal mask sets some scores to −∞ before the softmax, not some probabilities to 0 after it. "
                      "Why does the order matter?",
                      "How many numbers does P hold for N = 4096 tokens, and why does that matter for lesson 2?")),
    Lesson(2, "io_bound", "Why attention is IO-bound", True, minutes=110,
           objectives=("count the FLOPs and HBM bytes of each step of naive attention",
                       "compute arithmetic intensity and place a kernel on a GPU's roofline",
                       "explain why writing S and P to HBM, not the FLOPs, limits naive attention"),
           prerequisites="lesson 1",
           questions=("What is the arithmetic intensity of the softmax step of naive attention, and is it "
                      "compute- or memory-bound on an H100?",
                      "At N = 4096, d = 128 in fp16, which tensors dominate the HBM traffic of one head, "
                      "and by how much?",
                      "Doubling N multiplies naive attention's time by about how much, and why?",
                      "Which of the three ways out is exact, and which bytes does it remove?")),
    Lesson(3, "online_softmax", "Online softmax and tiled attention in NumPy", True, minutes=90,
           objectives=("compute a safe softmax in one pass with the running max m and sum ℓ",
                       r"merge two partial results $(m, \ell, z)$ with the merge rule",
                       "tile attention into b_q × b_k blocks and reproduce lesson 1's O exactly",
                       "count HBM and SRAM traffic of naive and tiled attention"),
           prerequisites="lessons 1 and 2",
           questions=("Why subtract the maximum before exponentiating, and why does the result not change?",
                      r"When the running maximum grows from $m$ to $m'$, what happens to $\ell$ and $z$, and why?",
                      "In tiled attention, which tensors never reach HBM?",
                      "How does the tiled traffic depend on the SRAM size $M$?")),
    Lesson(4, "triton_primer", "A Triton primer", True, minutes=105,
           objectives=("write a Triton kernel with programs, blocks, pointers and masks",
                       "write a fused row softmax that reads each row once",
                       "test a kernel against a reference in the interpreter and time it on a GPU",
                       "name what a program runs on (SMs, warps, registers, shared memory, L2, HBM, tensor cores) "
                       "and compute a kernel's occupancy from its registers and shared memory"),
           prerequisites="lesson 3; PyTorch tensors",
           questions=("What does one Triton program compute, and what decides how many run?",
                      "Why does the last block of a row need a mask, and what does `other=` do?",
                      "The fused softmax moves 4× fewer bytes than the five-pass version: why was it more than 4× "
                      "faster on the H100, and which ceiling does its bandwidth compare with?",
                      "What can the interpreter tell you about a kernel, and what can it not?",
                      "A kernel's program uses 4 warps, 141 registers a thread and 113 KiB of shared memory. How "
                      "many programs fit on one H100 SM, which resource decides, and what would you shrink to fit "
                      "one more?")),
    Lesson(5, "flash_attention", "FlashAttention in Triton", True, minutes=100,
           objectives=("build the FlashAttention forward kernel step by step in Triton",
                       r"add a causal mask aligned to the end, and GQA by head indexing: $r(h) = \lfloor h/g \rfloor$",
                       "read a performance ladder: each optimisation's predicted and measured gain",
                       "compare TFLOP/s with PyTorch's SDPA backends and the roofline"),
           prerequisites="lessons 3 and 4",
           questions=("Which loop of the kernel runs over key tiles, and what does each program keep in SRAM?",
                      "How does a GQA query head find its key/value head without copying K and V?",
                      r"Why does causal attention count half of the $4BH N_q N_k D$ FLOPs, and which tiles "
                      "need the mask?",
                      r"What does folding $\log_2 e$ into the scale save ($e^x = 2^{x \log_2 e}$), and how much did it "
                      "gain on the H100?",
                      "A program with a 128-row query tile streams all of K and V: what is its arithmetic "
                      "intensity against HBM at N = 4096, D = 128 in fp16, which side of the H100's ridge is that, "
                      "and what lets the kernel run faster than that roof allows?")),
    Lesson(6, "flash_backward", "FlashAttention backward", True, minutes=60,
           objectives=("derive dQ, dK and dV of attention",
                       "explain why the forward saves the log-sum-exp and the backward recomputes P",
                       "check a `torch.autograd.Function` against float64 autograd"),
           prerequisites="lesson 5; the chain rule",
           questions=(r"What is the softmax's backward in terms of $P$ and $dP$, and what is "
                      r"$D = \mathrm{rowsum}(dO \circ O)$?",
                      "Why does the backward need only the log-sum-exp of each row, not P?",
                      "Why are dK and dV computed in one loop and dQ in another?",
                      "Floating-point addition is not associative. Why can a one-pass backward that adds dQ "
                      "atomically give different gradients on two runs, and what do the two-loop design and "
                      "FlashAttention-3's deterministic mode each pay to make them reproducible?",
                      "A one-pass backward does 5 matrix products per pair of tiles, the two-loop design 7. What "
                      "ratio of their times does that predict, why is the measured ratio smaller, and which FLOP "
                      "count should a benchmark of either report?")),
    Lesson(7, "gqa_kv_cache", "GQA and the KV cache", True, minutes=100,
           objectives=(r"map query heads to key/value heads with $r(h) = \lfloor h/g \rfloor$",
                       "size a KV cache for a real model configuration",
                       "size an MLA latent cache, fold its up-projections into the query and the output, and say "
                       "why tensor parallelism cannot split it by heads",
                       "choose a cache layout (BNSH or BSNH) and an append mode",
                       "apply rotary embeddings fused with the cache append"),
           prerequisites="lessons 1 and 5",
           questions=("How many bytes per token does Llama 3 8B's KV cache take in bf16, and which factor "
                      "does GQA shrink?",
                      "What does `seqlens_k` hold before and after a decode step appends one token?",
                      "Half-split and interleaved RoPE rotate different pairs of dimensions: why must "
                      "the query and the key use the same one?",
                      "Why does GQA speed up decoding more than it speeds up prefill?",
                      "DeepSeek-V3 caches 576 numbers per token and layer for its 128 heads: why can the keys' "
                      "up-projection be folded into the query, and why does tensor parallelism not shrink this "
                      "cache per GPU?")),
    Lesson(8, "paged_attention", "Paged attention", True, minutes=100,
           objectives=("store K/V caches in fixed-size pages found through a page table",
                       "manage pages with a free list, reference counts and copy-on-write prefix sharing",
                       "measure fragmentation against contiguous allocation and choose a page size",
                       "write a paged decode kernel and split-KV with the merge rule of lesson 3",
                       "compare a decode kernel's bandwidth with the right ceiling, timed the same way, and "
                       "estimate a real model's decode step from its weight and cache bytes",
                       "attend with several new tokens per sequence over the pages (chunked prefill) and read "
                       "an FP8 cache"),
           prerequisites="lessons 3, 5 and 7",
           questions=("Which token slot of the cache holds token t of a sequence, given its page table and page size?",
                      "When two sequences share a prefix page and one appends, what does copy-on-write do, and "
                      "where does contiguous allocation waste memory that pages do not?",
                      "Why does split-KV help decode with a small batch, and what merges the splits?",
                      "Llama 3 8B decodes 4096-token sequences on an H100: at what batch do the caches' bytes "
                      "overtake the weights' bytes in a step, and how do GQA and an FP8 cache move that batch?",
                      "Which keys does new token i of a chunk of q_len tokens see, and what does an FP8 "
                      "cache's scale buy when K and V already lie inside e4m3's range?")),
    Lesson(9, "capstone_serving", "Capstone: serving a tiny model", True, minutes=110,
           objectives=("run prefill with `flash_attention` and decode with `paged_decode` in one model",
                       "schedule requests with continuous batching, chunked prefill, preemption and prefix caching",
                       "check generated tokens one by one against a no-cache reference",
                       "read where a decode step's time goes, and why CUDA graphs and device-side checks help",
                       "compare block-hash and radix-tree prefix caches, and decode a shared prefix once (cascade)"),
           prerequisites="lessons 5, 7 and 8",
           questions=("What does continuous batching do when a sequence finishes mid-batch?",
                      "Why are the generated tokens exactly those of the plain forward pass, not just close?",
                      "How do tokens per second change with batch size in decode, and why?",
                      "In the recorded eager decode step the GPU was busy less than a fifth of the time: where did "
                      "the rest go, and what removes it?",
                      "R requests share a P-token prompt and each adds S tokens of its own: how many cache bytes "
                      "does a decode step read with and without cascade decoding, and why are the results equal?")),
    Lesson(10, "beyond_one_gpu", "Beyond one GPU", True, minutes=135,
           objectives=("merge attention computed on different devices with the log-sum-exp rule",
                       "run ring attention, forward and backward, the all-gather K/V variant (its gradient a "
                       "reduce-scatter) and Ulysses' all-to-all of heads",
                       "count the bytes each scheme moves, and check the count against the calls it makes",
                       "balance causal work over ranks with the zig-zag split",
                       "predict when a ring hides its communication (α–β model, with the measured α and β and the "
                       "rate at the block's size) and size the KV cache per GPU under tensor parallelism",
                       "read speed-ups measured on 2 and 4 H100s and set the measured crossover beside the "
                       "α–β model's"),
           prerequisites="lessons 3, 5, 6 and 7; `torch.distributed` is introduced here",
           questions=("With a contiguous split and a causal mask, how much more work does the last of W ranks do "
                      "than the first, and how does the zig-zag split fix it?",
                      "Why does grouped-query attention make all-gathering K and V affordable, and why is the "
                      "all-gather's gradient a reduce-scatter rather than an all-reduce?",
                      "For which world sizes does Ulysses move fewer bytes than a ring, and what stops it "
                      "from using more ranks than there are KV heads?",
                      "Why can a ring that hides its transfers at 8,192 tokens per rank fail to at 512, even "
                      "with a link of unlimited bandwidth?",
                      "Llama 3 70B has 8 KV heads: how does its KV cache per GPU change from 8 to 16 "
                      "tensor-parallel GPUs, and why?")),
)


# Optional deep dives, each beside its lesson (notebooks/NNb_slug.ipynb).
DEEP_DIVES: tuple[DeepDive, ...] = (
    DeepDive(5, "forward_tuning", "Tuning the forward kernel on an H100", minutes=100,
             objectives=("read where the forward's time goes beyond the kernel (the host path per call)",
                         "judge a ratio of two timings by its spread over repeats",
                         "see what persistent programs, warp specialisation and TMA change, and measure it"),
             prerequisites="lesson 5"),
    DeepDive(6, "backward_tuning", "Tuning the backward kernel on an H100", minutes=45,
             objectives=("compare the backward designs side by side with cuDNN",
                         "read hardware counters that explain a design's time",
                         "judge a ratio of two timings by its spread over repeats"),
             prerequisites="lesson 6 and deep dive 5"),
)


def course_entries() -> tuple[Lesson, ...]:
    """Every notebook entry of the course in reading order: each lesson, then its deep dives."""
    return tuple(entry for lesson in LESSONS
                 for entry in (lesson, *(d for d in DEEP_DIVES if d.number == lesson.number)))


def repo_url(path: str = "") -> str:
    """The address of ``path`` (relative to the repository root) at the release, or of the repository."""
    return f"{REPO_URL}/blob/{REF}/{path}" if path else REPO_URL


def colab_url(path: str) -> str:
    """The Colab address that opens ``path`` (relative to the repository root) at the release."""
    repo = REPO_URL.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{repo}/blob/{REF}/{path}"


def pip_spec() -> str:
    """What Colab's setup cell installs: the course at the release tag (pip builds it from the tag)."""
    return f"attnkit @ git+{REPO_URL}@{REF}"


def readme_toc(root) -> str:
    """The README's table of contents: one row per lesson, with its time and its status from the files present."""
    from pathlib import Path

    rows = ["| lesson | time | lab | status |", "|---|---|---|---|"]
    for lesson in course_entries():
        badge = (f"[![Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                 f"({colab_url(lesson.notebook)})")
        lab = f"[Lab {lesson.number:02d}]({lesson.lab}) · [solution]({lesson.solution})" if lesson.has_lab else ""
        ready = (Path(root) / lesson.notebook).exists() and (not lesson.has_lab or (Path(root) / lesson.lab).exists())
        minutes = f"{lesson.minutes} min" if lesson.minutes else ""
        rows.append(f"| [{lesson.heading}]({lesson.notebook}) {badge} | {minutes} | {lab} | "
                    f"{'ready' if ready else 'in preparation'} |")
    return "\n".join(rows)


def nbgrader_source(number: int, course_dir):
    """Put lab ``number``'s solution where nbgrader's ``generate_assignment`` reads it, and return its path.

    ``course_dir/source/labNN/labNN_slug.ipynb``: the solution notebook (its ``### BEGIN SOLUTION``
    regions and nbgrader metadata are what nbgrader reads) with the lab's Colab badge instead of the
    solution's, so that the notebook nbgrader releases links to the lab, as ``labs/`` does.
    """
    from pathlib import Path

    import nbformat

    lesson = next((entry for entry in LESSONS if entry.number == number), None)
    if lesson is None or not lesson.has_lab:
        labs = ", ".join(str(entry.number) for entry in LESSONS if entry.has_lab)
        raise ValueError(f"number: lesson {number} has no lab (labs: {labs})")
    root = Path(__file__).resolve().parents[2]
    solution = root / lesson.solution
    if not solution.exists():
        raise ValueError(f"number: {lesson.solution} is not here (a clone of the course has it; a wheel does not)")
    nb = nbformat.read(solution, as_version=4)
    badge_of_solution, badge_of_lab = colab_url(lesson.solution), colab_url(lesson.lab)
    if badge_of_solution not in nb.cells[0].source:
        raise ValueError(f"number: {lesson.solution} does not open with its Colab badge (run `make headers`)")
    nb.cells[0].source = nb.cells[0].source.replace(badge_of_solution, badge_of_lab)
    assignment = Path(lesson.lab).stem[:5]                       # "lab01"
    target = Path(course_dir) / "source" / assignment / Path(lesson.lab).name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


def main(argv=None) -> int:
    """``python -m attnkit.classroom.course nbgrader-source NN COURSE_DIR``: see ``nbgrader_source``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.course")
    commands = parser.add_subparsers(dest="command", required=True)
    source = commands.add_parser("nbgrader-source", help="put a lab's solution into an nbgrader course's source/")
    source.add_argument("lab", type=int, help="the lab's number, e.g. 01")
    source.add_argument("course_dir", help="the nbgrader course folder (where nbgrader_config.py is)")
    args = parser.parse_args(argv)
    try:
        print(nbgrader_source(args.lab, args.course_dir))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
