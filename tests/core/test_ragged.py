"""Ragged batches and continuous batching in the one engine.

Every row commits its own count each step, so a row's tokens must depend only on its prefix and
its generator: decoded alone, in a batch, or through a queue of requests sharing a few slots, the
same row with the same generator gives the same tokens (float64 tiny models, where the arithmetic
does not depend on the batch's make-up). Each test also shows that its rows really did accept
different counts, so the ragged path is the one exercised.
"""

import pytest
import torch

from conftest import tiny_hf, tiny_llamagen
from drafters.harness import PLAIN, RAGGED_GUIDED as GUIDED
from drafters.harness import class_labels as _labels, generators as _generators, jacobi as _jacobi
from visualspec.drafters import DraftModelDrafter, JacobiDrafter
from visualspec.core.engine import Requests, decode
from visualspec.models.hf import HFCausalLM
from visualspec.core.sampling import SamplingConfig


@pytest.mark.parametrize("coupling", [False, True], ids=["sjd", "sjd-coupled"])
@pytest.mark.parametrize("sampling", [PLAIN, GUIDED], ids=["plain", "guided"])
def test_a_row_decodes_alike_alone_in_a_batch_and_in_a_queue(sampling, coupling):
    model = tiny_llamagen(seed=2, vocab_size=16, block_size=16, std=0.3)
    ids = list(range(6))
    batch, stats = decode(model, _labels(ids, sampling), 16, sampling, drafter=_jacobi(coupling), window=5,
                          generator=_generators(ids))
    assert stats.row_forwards.unique().numel() > 1, "rows must accept different counts"
    assert len(set(stats.accepted_lengths)) > 2
    for i in ids:
        alone, _ = decode(model, _labels([i], sampling), 16, sampling, drafter=_jacobi(coupling), window=5,
                          generator=_generators([i]))
        assert torch.equal(alone[0], batch[i]), f"row {i} depends on its batch mates"
    queued, qstats = decode(model, Requests(6, lambda rows: _labels(rows, sampling), slots=2), 16, sampling,
                            drafter=_jacobi(coupling), window=5, generator=_generators(ids))
    assert torch.equal(queued, batch)
    assert qstats.slots == 2 and qstats.target_forwards > stats.target_forwards  # refills are prefills
    assert torch.equal(qstats.row_forwards, stats.row_forwards)
    assert torch.equal(qstats.fixed_at, stats.fixed_at)


def test_a_queue_with_a_draft_model_decodes_like_one_batch():
    target = tiny_llamagen(seed=0, vocab_size=16, block_size=16, std=0.3)
    draft = tiny_llamagen(seed=5, vocab_size=16, block_size=16, dim=16, n_layer=1, std=0.3)
    ids = list(range(5))
    batch, stats = decode(target, _labels(ids, GUIDED), 16, GUIDED, window=4, generator=_generators(ids),
                          drafter=DraftModelDrafter(draft, _labels(ids, GUIDED)))
    assert stats.row_forwards.unique().numel() > 1
    queued, _ = decode(target, Requests(5, lambda rows: _labels(rows, GUIDED), slots=2), 16, GUIDED, window=4,
                       generator=_generators(ids), drafter=DraftModelDrafter(draft, lambda rows: _labels(rows, GUIDED)))
    assert torch.equal(queued, batch)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_text_rows_of_different_prompt_lengths_decode_alike_alone_and_together(static):
    model = HFCausalLM(tiny_hf("llama"), static=static)
    ids = torch.randint(2, 64, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    ids[1, :2] = 0
    together, stats = decode(model, (ids, mask), 20, SamplingConfig(temperature=0.8),
                             drafter=JacobiDrafter(64, "repeat_left"), window=4, generator=_generators([0, 1, 2]))
    assert stats.row_forwards.unique().numel() > 1
    for b in range(3):
        row = (ids[b:b + 1, 2:], mask[b:b + 1, 2:]) if b == 1 else (ids[b:b + 1], mask[b:b + 1])
        alone, _ = decode(model, row, 20, SamplingConfig(temperature=0.8), drafter=JacobiDrafter(64, "repeat_left"),
                          window=4, generator=_generators([b]))
        assert torch.equal(alone[0], together[b])


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_a_transformers_model_refills_rows_as_it_decodes_them_alone(static):
    """Continuous batching on the transformers adapter: a queue of prompts of different lengths,
    two at a time, so that refilled prompts are both shorter and longer than the cache's prefix
    columns; each row's tokens equal its tokens decoded alone, with a generator per prompt, and
    the cache stays as wide as a prompt and its tokens, not the queue."""
    widths = []

    class Watched(HFCausalLM):  # records the cache's width after each refill
        def refill(self, rows, prefix):
            logits = super().refill(rows, prefix)
            widths.append(self.column_valid.shape[1])
            return logits

    model = Watched(tiny_hf("llama"), static=static)
    lengths = [3, 6, 2, 7, 4] * 2
    prompts = [torch.randint(2, 64, (n,), generator=torch.Generator().manual_seed(i)) for i, n in enumerate(lengths)]

    def prefix(rows):
        width = max(len(prompts[r]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - len(prompts[r]):], mask[i, width - len(prompts[r]):] = prompts[r], 1
        return ids, mask

    sampling = SamplingConfig(temperature=0.8)
    queued, stats = decode(model, Requests(10, prefix, slots=2), 12, sampling, drafter=JacobiDrafter(64, "repeat_left"),
                           window=3, generator=_generators(range(10)))
    assert stats.slots == 2 and stats.row_forwards.unique().numel() > 1
    assert widths and max(widths) <= max(lengths) + 12 + 3, "the cache grows with the queue"
    for r in range(10):
        alone, _ = decode(model, prefix([r]), 12, sampling, drafter=JacobiDrafter(64, "repeat_left"), window=3,
                          generator=_generators([r]))
        assert torch.equal(alone[0], queued[r]), f"prompt {r} depends on the rows it was batched with"


def test_finished_rows_leave_the_batch():
    model = tiny_llamagen(seed=2, vocab_size=16, block_size=16, std=0.3)
    shapes = []
    original = model.forward_window

    def spy(tokens, start, **kw):
        shapes.append(tokens.shape[0])
        return original(tokens, start, **kw)

    model.forward_window = spy
    _, stats = decode(model, _labels(range(6), PLAIN), 16, PLAIN, drafter=_jacobi(), window=5,
                      generator=_generators(range(6)))
    assert shapes[0] == 6 and shapes[-1] < 6 and shapes == sorted(shapes, reverse=True)
    assert stats.target_forwards == len(shapes) + 1


class _KeepsRows:
    """A target that cannot drop rows (no ``select``): finished rows stay in its batch, idle."""

    def __init__(self, model, takes_post: bool):
        self.model, self.vocab_size, self.takes_post = model, model.vocab_size, takes_post

    def prefill(self, *args, **kw):
        return self.model.prefill(*args, **kw)

    def forward_window(self, *args, **kw):
        return self.model.forward_window(*args, **kw)

    def crop(self, lengths):
        self.model.crop(lengths)


@pytest.mark.parametrize("window", [1, 4], ids=["AR", "Jacobi"])
@pytest.mark.parametrize("takes_post", [False, True], ids=["engine-verified", "step-verified"])
def test_idle_rows_commit_nothing(takes_post, window):
    """AR and Jacobi steps over a batch whose finished rows cannot leave it (a stop token ends rows
    apart) give each row the tokens it gets where finished rows leave: an idle row's steps commit
    nothing, whether the engine or the target's step samples and verifies."""
    model = tiny_llamagen(seed=2, vocab_size=16, block_size=16, std=0.3)
    labels = _labels(range(4), GUIDED)

    def run(target):
        return decode(target, labels, 16, GUIDED, stop_token=3, generator=_generators(range(4)), window=window,
                      drafter=JacobiDrafter(16) if window > 1 else None)
    ref, ref_stats = run(model)
    out, stats = run(_KeepsRows(model, takes_post))
    stopped = (ref == 3).any(1)
    assert stopped.any() and not stopped.all(), "some rows should stop early, others not"
    assert torch.equal(out, ref) and torch.equal(stats.fixed_at, ref_stats.fixed_at)
    assert torch.equal(stats.row_forwards, ref_stats.row_forwards)  # an idle row counts no forwards


def test_bad_batches_get_clear_errors():
    model = tiny_llamagen(vocab_size=16, block_size=16)
    with pytest.raises(ValueError, match="3 generators for a batch of 2"):
        decode(model, _labels([0, 1], PLAIN), 16, PLAIN, generator=_generators([0, 1, 2]))
    with pytest.raises(ValueError, match="slots"):
        Requests(4, lambda rows: None, slots=0)
    class NoRefill:  # a token model that cannot start new sequences mid-decode
        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            if name == "refill":
                raise AttributeError(name)
            return getattr(self.model, name)

    with pytest.raises(TypeError, match="continuous batching"):
        decode(NoRefill(HFCausalLM(tiny_hf("llama"))),
               Requests(2, lambda rows: torch.ones(len(rows), 3, dtype=torch.long), 1), 4, PLAIN)
    with pytest.raises(ValueError, match="window"):
        decode(model, _labels([0], PLAIN), 16, PLAIN, drafter=_jacobi(), window=0)


def test_draft_model_trees_take_one_generator_per_prompt(tokenizer):
    """A draft tree of depth 2 branches the draft model's rows; its chains are still sampled with
    one generator per prompt (this crashed with "got 2 generators for a batch of 4"), and a
    prompt's text depends on its own generator only."""
    from visualspec.text import generate_text

    target, draft = tiny_hf("llama"), tiny_hf("llama", seed=3)
    prompts = ["w5 w6 w7 w8 w5 w6", "w9 w10 w11"]
    kw = dict(drafter=draft, branches=2, depth=2, window=5, max_new_tokens=12, temperature=0.8)
    both = generate_text(target, tokenizer, prompts, generator=_generators([3, 4]), **kw)
    assert both.stats.row_forwards.unique().numel() > 1 or len(set(both.stats.accepted_lengths)) > 1
    for prompt, seed, ids in zip(prompts, [3, 4], both.token_ids):
        alone = generate_text(target, tokenizer, [prompt], generator=_generators([seed]), **kw)
        assert alone.token_ids[0] == ids


@pytest.mark.parametrize("queue", [False, True], ids=["batch", "queue"])
def test_a_stop_token_ends_each_row_where_it_first_commits_it(queue):
    model = tiny_llamagen(seed=2, vocab_size=16, block_size=16, std=0.3)
    ids = list(range(6))
    full, full_stats = decode(model, _labels(ids, PLAIN), 16, PLAIN, drafter=_jacobi(False), window=4,
                              generator=_generators(ids))
    # the token some rows commit first at their earliest: rows then stop at different positions
    stop = int(torch.mode(full[:, 2:8].flatten()).values)
    first = [row.tolist().index(stop) if stop in row.tolist() else None for row in full]
    assert len({f for f in first if f is not None}) > 1 and min(f for f in first if f is not None) < 12
    prefix = Requests(6, lambda rows: _labels(rows, PLAIN), slots=2) if queue else _labels(ids, PLAIN)
    out, stats = decode(model, prefix, 16, PLAIN, drafter=_jacobi(False), window=4, generator=_generators(ids),
                        stop_token=stop)
    for row, ref, at in zip(out, full, first):
        if at is None:  # the control: a row that never commits the stop token decodes as before
            assert torch.equal(row, ref)
        else:
            assert torch.equal(row[:at + 1], ref[:at + 1]) and bool((row[at:] == stop).all())
    assert int(stats.row_forwards.sum()) < int(full_stats.row_forwards.sum())  # stopped rows forward no more
    assert stats.stopped_tokens == sum(16 - 1 - at for at in first if at is not None)  # filled, not generated
    assert stats.tokens_per_sequence == 16 - stats.stopped_tokens / 6
