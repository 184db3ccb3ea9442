"""The course's table of contents and its home, defined once.

The README's table, every notebook's "Open in Colab" badge and Colab install cell, and the site are
made from (and tested against) what is written here.
"""
from __future__ import annotations

from dataclasses import dataclass

# Where the course lives. A fork changes these two lines and runs `make headers`.
REPO_URL = "https://github.com/attnkit/attention-kernels-course"
BRANCH = "main"


@dataclass(frozen=True)
class Lesson:
    number: int
    slug: str        # notebooks/{number:02d}_{slug}.ipynb
    title: str
    has_lab: bool

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.number:02d}_{self.slug}.ipynb"

    @property
    def lab(self) -> str | None:
        return f"labs/lab{self.number:02d}_{self.slug}.ipynb" if self.has_lab else None

    @property
    def solution(self) -> str | None:
        return f"solutions/lab{self.number:02d}_{self.slug}.ipynb" if self.has_lab else None


LESSONS = (
    Lesson(0, "setup", "Setup: what runs where", False),
    Lesson(1, "attention_by_hand", "Attention by hand", True),
    Lesson(2, "io_bound", "Why attention is IO-bound", False),
    Lesson(3, "online_softmax", "Online softmax and tiled attention in NumPy", True),
    Lesson(4, "triton_primer", "A Triton primer", False),
    Lesson(5, "flash_attention", "FlashAttention in Triton", True),
    Lesson(6, "flash_backward", "FlashAttention backward", False),
    Lesson(7, "gqa_kv_cache", "GQA and the KV cache", True),
    Lesson(8, "paged_attention", "Paged attention", True),
    Lesson(9, "capstone_serving", "Capstone: serving a tiny model", False),
)


def colab_url(path: str) -> str:
    """The Colab address that opens ``path`` (relative to the repository root) from GitHub."""
    repo = REPO_URL.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{repo}/blob/{BRANCH}/{path}"


def pip_spec() -> str:
    """What Colab's setup cell installs."""
    return f"attnkit @ git+{REPO_URL}@{BRANCH}"


def readme_toc(root) -> str:
    """The README's table of contents: one row per lesson, with its status from the files present."""
    from pathlib import Path

    rows = ["| # | lesson | lab | status |", "|---|---|---|---|"]
    for lesson in LESSONS:
        badge = (f"[![Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                 f"({colab_url(lesson.notebook)})")
        lab = f"[lab {lesson.number:02d}]({lesson.lab}) · [solution]({lesson.solution})" if lesson.has_lab else ""
        ready = (Path(root) / lesson.notebook).exists() and (not lesson.has_lab or (Path(root) / lesson.lab).exists())
        rows.append(f"| {lesson.number} | [{lesson.title}]({lesson.notebook}) {badge} | {lab} | "
                    f"{'ready' if ready else 'in preparation'} |")
    return "\n".join(rows)
