"""Write the tiny model's corpus and train the model that lesson 9 serves.

    python scripts/train_tiny_model.py                  # corpus + weights into attnkit/data/
    python scripts/train_tiny_model.py --out DIR        # the same files into DIR

1. A small grammar about the course's topics writes ``attnkit/data/tiny_corpus.txt``: one sentence a
   line, lowercase, a few tens of KB.
2. A character-level ``attnkit.serving.tinymodel.TinyModel`` (2 layers, GQA with 4 query and 2 key/value
   heads of dimension 16, RoPE) learns it with AdamW, in float32 on the CPU, with PyTorch's own
   attention (training needs no cache).
3. The weights, the configuration and the vocabulary go to ``attnkit/data/tiny_model.pt``.

Everything is seeded: the same torch version on the same kind of CPU writes the same file.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnkit.serving.tinymodel import CORPUS_PATH, WEIGHTS_PATH, TinyConfig, TinyModel, save_model  # noqa: E402

# ------------------------------------------------------------------------------------------ grammar
# Each subject has its own verb phrases, so every sentence the grammar writes is true of the course.
FACTS = {
    "the kernel": [
        "reads each tile of keys once",
        "keeps the scores in sram",
        "writes the output tile to hbm",
        "loads a block of queries",
        "masks the keys past the diagonal",
        "scales the scores by one over the square root of d",
    ],
    "flash attention": [
        "never writes the full score matrix",
        "keeps a running max and a running sum",
        "reads q, k and v from hbm once",
        "is exact, not an approximation",
        "recomputes the scores in the backward pass",
    ],
    "online softmax": [
        "keeps a running max and a running sum",
        "rescales the old sum when the max grows",
        "merges two blocks with one rule",
        "needs one pass over the scores",
    ],
    "the scheduler": [
        "frees the pages of a finished request",
        "admits a new request when pages are free",
        "runs prefill and decode in one step",
        "keeps the batch full",
        "stops a request at the end of its line",
    ],
    "a new request": [
        "takes the pages that a finished one freed",
        "waits until enough pages are free",
        "starts with a prefill of its prompt",
    ],
    "the kv cache": [
        "stores the keys and values of every token",
        "grows by one token per step",
        "lives in pages of sixteen tokens",
        "is read once per decode step",
    ],
    "the block allocator": [
        "keeps a free list of pages",
        "gives each sequence a page table",
        "counts the references to each page",
        "copies a shared page before a write",
    ],
    "the page table": [
        "maps a token position to a page",
        "holds one page number per block",
        "lets a sequence grow without a copy",
    ],
    "paged attention": [
        "reads the cache through a page table",
        "wastes at most one page per sequence",
        "splits a long sequence across programs",
    ],
    "grouped query attention": [
        "shares one kv head among several query heads",
        "makes the cache smaller",
        "reads each kv head once for its group",
    ],
    "each query head": [
        "reads the kv head of its group",
        "sees every key before it",
        "has its own row of scores",
    ],
    "the decoder": [
        "predicts the next token",
        "attends to every earlier token",
        "adds the attention output to the residual",
    ],
    "the softmax": [
        "turns scores into weights that sum to one",
        "subtracts the row max before the exponent",
    ],
    "rotary embedding": [
        "rotates each pair of dimensions by an angle",
        "encodes the position in the angle",
        "turns a dot product into a function of the distance",
    ],
    "the gpu": [
        "moves bytes slower than it computes",
        "runs many programs at once",
        "keeps hot tiles in shared memory",
    ],
}
TAILS = ["", "", "", " at every step", " on the gpu", " in one pass", " without a copy", " for each head",
         " in every layer", " by design"]
LINKS = [". ", ", and so ", ", but ", ", while "]


def clause(rng: random.Random) -> str:
    subject = rng.choice(list(FACTS))
    return f"{subject} {rng.choice(FACTS[subject])}{rng.choice(TAILS)}"


def sentence(rng: random.Random) -> str:
    """One line: one clause, or two joined by a link word."""
    if rng.random() < 0.3:
        link = rng.choice(LINKS)
        return f"{clause(rng)}{link}{clause(rng)}."
    return f"{clause(rng)}."


def write_corpus(path: Path, n_sentences: int = 500, seed: int = 0) -> str:
    rng = random.Random(seed)
    text = "\n".join(sentence(rng) for _ in range(n_sentences)) + "\n"
    path.write_text(text)
    return text


# ----------------------------------------------------------------------------------------- training
def batches(data: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """Random windows of ``length + 1`` characters: inputs [batch, length], targets shifted by one."""
    while True:
        starts = torch.randint(0, data.numel() - length - 1, (batch,), generator=gen)
        windows = torch.stack([data[s:s + length + 1] for s in starts.tolist()])
        yield windows[:, :-1], windows[:, 1:]


def train(text: str, steps: int, batch: int, length: int, lr: float, seed: int) -> tuple[TinyModel, list]:
    torch.manual_seed(seed)
    vocab = sorted(set(text))
    config = TinyConfig(vocab_size=len(vocab))
    model = TinyModel(config, vocab)
    data = torch.tensor(model.encode(text), dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = steps // 20
    log = []
    for step, (x, y) in zip(range(steps), batches(data, batch, length, gen)):
        scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr * max(scale, 0.02)
        logits = model(x)                                     # [batch, length, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log.append((step, loss.item()))
            print(f"step {step:5d}  loss {loss.item():.3f}", flush=True)
    return model.eval(), log


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the corpus and the weights (default: attnkit/data/)")
    args = parser.parse_args(argv)
    corpus_path = args.out / CORPUS_PATH.name if args.out else CORPUS_PATH
    weights_path = args.out / WEIGHTS_PATH.name if args.out else WEIGHTS_PATH
    torch.set_num_threads(2)
    start = time.perf_counter()
    text = write_corpus(corpus_path, seed=args.seed)
    print(f"corpus: {len(text)} characters, {len(set(text))} distinct, in {corpus_path}")
    model, _ = train(text, args.steps, args.batch, args.length, args.lr, args.seed)
    save_model(model, weights_path)
    size = weights_path.stat().st_size
    print(f"weights: {sum(p.numel() for p in model.parameters())} parameters, {size / 1024:.0f} KiB "
          f"in {weights_path}; {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
