"""Proactive drafting (sibling trees): exact law by chi-square, a wrong sibling rule as a control,
the tree attention of LlamaGen against its chain forward, and the arguments' errors."""

import pytest
import torch

from conftest import tiny_llamagen
from drafters.harness import GUIDED, PLAIN, RAGGED_GUIDED, N, V, labels_prefix
from drafters.harness import class_labels as _labels, generators as _generators, jacobi as _jacobi
from visualspec.core import proactive
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.multidraft import MultiDraftVerdict, _decide, _ratio
from visualspec.core.sampling import SamplingConfig
from visualspec.core.verify import lantern_verify, residual
from visualspec.core.window import interpolated_cost
from visualspec.drafters import DraftModelDrafter, JacobiDrafter

SAMPLES = 40000


def tree_fit(model, sampling, drafter, siblings, depth=2, window=4, seed=0, samples=SAMPLES):
    """Chi-square fit of proactive drafting; first checks, on one batch, that rows commit different
    counts and that some accepted paths went through a sibling (so the tree path is what is tested)."""
    prefix = labels_prefix(sampling)
    _, stats = decode(model, prefix(64), N, sampling, drafter=drafter(64), window=window, siblings=siblings,
                      sibling_depth=depth, generator=torch.Generator().manual_seed(seed))
    assert stats.row_forwards.unique().numel() > 1, "every row accepted alike: not a ragged batch"
    assert stats.sibling_steps > 0, "no accepted path took a sibling: the tree was not exercised"
    seqs, probs = exact_sequence_distribution(model, prefix, N, sampling)
    drawn = sample_sequences(model, prefix, N, sampling, samples, seed=seed, window=window, siblings=siblings,
                             sibling_depth=depth, drafter_factory=drafter)
    return chi_square_fit(drawn, seqs, probs)


@pytest.mark.parametrize("sampling, siblings, depth, coupling", [(PLAIN, 3, 1, False), (GUIDED, 2, 1, True)],
                         ids=["plain-3-siblings-1-level", "guided-topk-topp-2-siblings-coupled"])
def test_jacobi_sibling_trees_are_lossless(sampling, siblings, depth, coupling):
    """Three siblings exercise the recursive stages (a second sibling is tested against the
    residual of two); the guided batch (doubled rows) runs through tree attention and keep(). Its
    top-k of 3 leaves 81 possible sequences, so half the samples still fill every tested cell."""
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    fit = tree_fit(model, sampling, lambda rows: JacobiDrafter(V, "repeat_above", grid_width=2, coupling=coupling),
                   siblings, depth, samples=SAMPLES if sampling is PLAIN else SAMPLES // 2)
    assert fit.passed, fit


def test_draft_model_sibling_trees_are_lossless():
    """A draft model's q gives siblings at every level, not only at carried Jacobi positions."""
    target = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    draft = tiny_llamagen(seed=7, vocab_size=V, block_size=N, dim=16, n_layer=1)
    fit = tree_fit(target, PLAIN, lambda rows: DraftModelDrafter(draft, labels_prefix(PLAIN)(rows)), 2)
    assert fit.passed, fit


def fixed_target_rsd(candidates, q, p, generator=None):
    """A wrong sibling rule: every candidate is tested against p itself, never against the residual
    left by the candidates before it (the released code's siblings are likewise not tested against
    the law they were drawn from)."""
    q, p = q.double(), p.double()
    accept = torch.stack([_ratio(p.gather(1, candidates[:, i:i + 1]), q.gather(1, candidates[:, i:i + 1]))[:, 0]
                          for i in range(candidates.shape[1])], 1)
    verdict = _decide(candidates, accept, residual(p, q), generator)
    return MultiDraftVerdict(verdict.index, verdict.token)


def test_the_harness_catches_a_wrong_sibling_rule(monkeypatch):
    """Control: with siblings tested against p instead of the recursive residual the law is wrong,
    and only sibling levels use the patched rule, so the failure shows siblings are exercised. It
    fails by far (chi-square about 15,000 against a bound of 316 at 40,000 samples), so a fifth of
    the samples suffices."""
    monkeypatch.setattr(proactive, "rsd_verify", fixed_target_rsd)
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    fit = tree_fit(model, PLAIN, lambda rows: JacobiDrafter(V, "repeat_above", grid_width=2), 2, samples=8000)
    assert not fit.passed, fit


def test_greedy_sibling_trees_decode_as_ar():
    """Greedy drafts are point masses, so siblings never win; the tokens are AR's."""
    model = tiny_llamagen(seed=3, vocab_size=16, block_size=16)
    greedy = SamplingConfig(temperature=0)
    prefix = torch.tensor([0, 1, 2])
    ar, _ = decode(model, prefix, 16, greedy)
    tree, stats = decode(model, prefix, 16, greedy, drafter=JacobiDrafter(16, "random"), window=5, siblings=2,
                         generator=torch.Generator().manual_seed(0))
    assert torch.equal(ar, tree)
    assert stats.target_forwards < 16


def test_llamagen_tree_attention_matches_the_chain_and_keeps_the_right_nodes():
    """forward_tree over [root, chain, siblings] gives the chain forward's logits on the chain
    nodes and, for a sibling, the logits of a chain that holds it; after keep() the cache holds the
    kept path, so the next window's logits equal a fresh run over the same tokens."""
    model = tiny_llamagen(seed=1, vocab_size=8, block_size=16)
    label = torch.tensor([1])
    layout = proactive.sibling_layout(3, 2, 2)  # nodes: root, chain 1..3, then (1,), (0,1), (1,0), (1,1)
    tokens = torch.tensor([[5, 1, 2, 3, 6, 7, 2, 7]])
    model.prefill(label, 16)
    model.forward_window(torch.tensor([[4, 4]]), 0)
    tree = model.forward_tree(tokens, layout.depths, layout.ancestors, torch.tensor([2]))

    def chain(seq):
        model.prefill(label, 16)
        return model.forward_window(torch.tensor([[4, 4] + seq]), 0)[:, 2:]

    assert torch.allclose(tree[:, :4], chain([5, 1, 2, 3]))
    assert torch.allclose(tree[:, 7], chain([5, 6, 7])[:, 2])  # node (1, 1): 7 after the sibling 6
    model.prefill(label, 16)
    model.forward_window(torch.tensor([[4, 4]]), 0)
    model.forward_tree(tokens, layout.depths, layout.ancestors, torch.tensor([2]))
    model.keep(torch.tensor([[0, 4, 7]]), torch.tensor([3]))  # the root, sibling 6, then its child 7
    after = model.forward_window(torch.tensor([[3]]), torch.tensor([5]))
    assert torch.allclose(after[:, 0], chain([5, 6, 7, 3])[:, 3])


def test_sibling_candidates_are_distinct_and_start_with_the_draft():
    q = torch.tensor([[[0.5, 0.5, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]]])
    drafts = torch.tensor([[1, 3]])
    out = proactive.draw_siblings(drafts, q, 4, torch.Generator().manual_seed(0))
    assert out.shape == (1, 2, 4) and torch.equal(out[..., 0], drafts)
    assert all(len(set(row.tolist())) == 4 for row in out[0])
    assert out[0, 0, 1] == 0  # the only other token q can draw comes first


def test_bad_sibling_arguments_are_refused():
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    prefix = torch.tensor([1])
    with pytest.raises(ValueError, match="siblings must be an integer >= 1"):
        decode(model, prefix, N, PLAIN, drafter=JacobiDrafter(V), window=3, siblings=0)
    with pytest.raises(ValueError, match="sibling_depth must be an integer >= 0"):
        decode(model, prefix, N, PLAIN, drafter=JacobiDrafter(V), window=3, siblings=2, sibling_depth=-1)
    with pytest.raises(ValueError, match="lossless rule only"):
        decode(model, prefix, N, PLAIN, drafter=JacobiDrafter(V), window=3, siblings=2, rule=lantern_verify)

    class ChainOnly:
        vocab_size = V

    with pytest.raises(TypeError, match="no forward_tree"):
        decode(ChainOnly(), prefix, N, PLAIN, drafter=JacobiDrafter(V), window=3, siblings=2)


def test_tree_costs_are_interpolated_from_the_window_table():
    costs = {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4}
    assert interpolated_cost(costs, 4) == 1.6
    assert interpolated_cost(costs, 6) == pytest.approx(2.0)
    assert interpolated_cost(costs, 12) == pytest.approx(3.2)  # along the slope of 4..8
    assert proactive.extra_nodes(2, 3) == 2 + 8


def test_a_row_of_a_sibling_tree_decodes_alike_alone_in_a_batch_and_in_a_queue():
    """Ragged rows and continuous batching with trees: the scratch slots survive select() and
    refills, and a row's tokens depend only on its generator."""
    from visualspec.core.engine import Requests

    model = tiny_llamagen(seed=2, vocab_size=16, block_size=16, std=0.3)
    ids = list(range(6))
    tree = dict(window=5, siblings=3, sibling_depth=2)
    batch, stats = decode(model, _labels(ids, RAGGED_GUIDED), 16, RAGGED_GUIDED, drafter=_jacobi(True),
                          generator=_generators(ids), **tree)
    assert stats.row_forwards.unique().numel() > 1 and stats.sibling_steps > 0
    for i in ids[:3]:
        alone, _ = decode(model, _labels([i], RAGGED_GUIDED), 16, RAGGED_GUIDED, drafter=_jacobi(True),
                          generator=_generators([i]), **tree)
        assert torch.equal(alone[0], batch[i]), f"row {i} depends on its batch mates"
    queued, _ = decode(model, Requests(6, lambda rows: _labels(rows, RAGGED_GUIDED), slots=2), 16, RAGGED_GUIDED,
                       drafter=_jacobi(True), generator=_generators(ids), **tree)
    assert torch.equal(queued, batch)


def test_a_tree_step_is_timed_like_a_window():
    """The window policy prices trees by timing whole tree steps (forward, walk, keep) through
    measure_window_costs; here under guidance (the model batch is [cond; null])."""
    from visualspec.core.window_costs import measure_window_costs

    model = tiny_llamagen(seed=0, vocab_size=16, block_size=16)
    step = proactive.tree_step_timer(model, rows_per_sample=2, siblings=3, depth=2)
    costs = measure_window_costs(model, torch.tensor([1, 2, 3, 3]), 16, windows=(1, 2, 4), repeats=1, forward=step)
    assert set(costs) == {1, 2, 4} and all(c > 0 for c in costs.values())
