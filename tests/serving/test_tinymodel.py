"""The tiny model of lesson 9: its shipped weights produce the corpus's language, its pieces fit together."""
import importlib.util
import math
import re

import pytest
import torch
from conftest import ROOT

from attnkit.reference.attention import attention_ref
from attnkit.serving.tinymodel import (
    CORPUS_PATH,
    TinyConfig,
    TinyModel,
    causal_attention_torch,
    greedy_no_cache,
    load_model,
    save_model,
    tiny_model,
)
from attnkit.tolerances import assert_close


@pytest.fixture(autouse=True)
def one_thread():
    """The model is tiny: one thread avoids the cost of sharing two busy cores."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _training_script():
    spec = importlib.util.spec_from_file_location("train_tiny_model", ROOT / "scripts" / "train_tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_corpus_is_what_the_script_writes(tmp_path):
    script = _training_script()
    text = script.write_corpus(tmp_path / "corpus.txt")
    assert text == CORPUS_PATH.read_text()
    assert 10_000 < len(text.encode()) < 64_000


def test_weights_are_small_and_load():
    model = tiny_model()
    assert model.cfg.n_heads == 4 and model.cfg.n_kv_heads == 2 and model.cfg.head_dim == 16
    assert sum(p.numel() for p in model.parameters()) < 500_000
    assert model.vocab == sorted(set(CORPUS_PATH.read_text()))


def test_model_has_learned_the_corpus():
    """Next-character loss on the corpus far below a uniform guess (ln 28 ≈ 3.3 nats)."""
    model = tiny_model()
    text = CORPUS_PATH.read_text()[:4000]
    ids = torch.tensor([model.encode(text)])
    losses = []
    with torch.no_grad():
        for start in range(0, ids.shape[1] - 1, 96):
            chunk = ids[:, start:start + 97]
            logits = model(chunk[:, :-1])
            losses.append(torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum"))
    nats = float(sum(losses)) / (ids.shape[1] - 1)
    assert nats < 0.5, f"{nats:.3f} nats per character"
    assert nats < math.log(len(model.vocab)) / 5


@pytest.mark.parametrize("prompt", ["the kernel", "a new request", "the scheduler frees"])
def test_greedy_text_is_made_of_corpus_words(prompt):
    model = tiny_model()
    words = set(re.findall(r"[a-z]+", CORPUS_PATH.read_text()))
    tokens, logits = greedy_no_cache(model, model.encode(prompt), 90, model.encode("\n")[0])
    text = prompt + model.decode(tokens)
    assert logits.shape == (len(tokens), len(model.vocab))
    assert text.endswith("\n"), f"no end of line within 90 characters: {text!r}"
    unknown = set(re.findall(r"[a-z]+", text)) - words
    assert not unknown, f"{text!r} has words the corpus does not: {unknown}"


def test_attention_of_the_plain_path_matches_the_float64_reference():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 9, 16, generator=gen)
    k, v = (torch.randn(2, 2, 9, 16, generator=gen) for _ in range(2))
    assert_close(causal_attention_torch(q, k, v), attention_ref(q, k, v, causal=True), torch.float32)


def test_blocks_split_around_attention_give_the_forward_pass():
    model = tiny_model()
    tokens = torch.tensor([model.encode("the gpu runs many programs at once.")])
    positions = torch.arange(tokens.shape[1])[None]
    with torch.no_grad():
        x = model.embed(tokens)
        for block in model.blocks:
            q, k, v = block.project_qkv(x, positions)
            assert q.shape == (1, 4, tokens.shape[1], 16) and k.shape == v.shape == (1, 2, tokens.shape[1], 16)
            x = block.finish(x, attention_ref(q, k, v, causal=True).float())
        assert_close(model.logits(x), model(tokens), torch.float32)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = TinyModel(TinyConfig(vocab_size=3), ["a", "b", "\n"])
    save_model(model, tmp_path / "m.pt")
    again = load_model(tmp_path / "m.pt")
    tokens = torch.tensor([[0, 1, 2, 1]])
    assert torch.equal(again(tokens), model.eval()(tokens).detach())


def test_bad_input_is_named():
    model = tiny_model()
    with pytest.raises(ValueError, match="text: characters \\['Q'\\]"):
        model.encode("Query")
    with pytest.raises(ValueError, match="n_heads"):
        TinyConfig(vocab_size=3, n_heads=3, n_kv_heads=2)
    with pytest.raises(ValueError, match="tokens: expected \\[B, T\\]"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="prompt"):
        greedy_no_cache(model, [], 5)
