"""Dynamic draft trees (EAGLE-2's idea, made exact; #50): the allocation rule, the per-row layout,
RSD over a node's first children only, greedy output equal to AR on ragged rows with a feature
drafter, the tree's drafts equal to the chain's where they should be (with a control one column
off), and losslessness by chi-square with controls that must fail."""

from functools import partial

import pytest
import torch

from conftest import tiny_hf
from drafters.harness import N, V, drafter_net, prompt_prefix, ragged_greedy_ar, ragged_prompts
from visualspec.core.dynamic_tree import (DynamicTree, allocate_children, decode_dynamic_tree, draw_children,
                                          grow_level)
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.multidraft import rsd_verify
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import ChimeraDrafter, FeatureDrafter
from visualspec.models.chimera import ChimeraDraftModel
from visualspec.models.hf import HFCausalLM

GREEDY = SamplingConfig(temperature=0.0)


def test_children_go_to_the_best_estimates_of_path_probability():
    """Estimates 0.30, 0.18, 0.06 (node 0) and 0.36, 0.02, 0.02 (node 1): the best three give node 0
    two children and node 1 one."""
    path = torch.tensor([[0.6, 0.4]])
    ranked = torch.tensor([[[0.5, 0.3, 0.1], [0.9, 0.05, 0.05]]])
    assert allocate_children(path, ranked, 3).tolist() == [[2, 1]]
    assert allocate_children(path, ranked, 1).tolist() == [[0, 1]]


def test_a_level_keeps_each_nodes_first_children_in_draw_order():
    q = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    tokens, parents, path = grow_level(torch.tensor([[0.5, 0.5]], dtype=torch.float64), q, q, 3, g)
    g = torch.Generator().manual_seed(0)
    drawn = draw_children(q, 3, g)  # the same draws
    counts = allocate_children(torch.tensor([[0.5, 0.5]], dtype=torch.float64), q.sort(-1, descending=True).values, 3)
    want = [int(t) for i in range(2) for t in drawn[0, i, :counts[0, i]]]
    assert tokens[0].tolist() == want and parents[0].tolist() == sorted(parents[0].tolist())
    assert torch.allclose(path[0], 0.5 * q[0, parents[0], tokens[0]])


def test_each_rows_tree_has_its_own_ancestors():
    """Row 0: level 2's nodes hang under level 1's slots 0 and 1; row 1: both under slot 1."""
    tree = DynamicTree(torch.zeros(2, 2, 2, dtype=torch.long), torch.tensor([[[0, 0], [0, 1]], [[0, 0], [1, 1]]]),
                       None)
    depths, ancestors = tree.layout()
    assert depths.tolist() == [0, 1, 1, 2, 2]
    assert ancestors[0, 3].tolist() == [True, True, False, True, False]
    assert ancestors[0, 4].tolist() == [True, False, True, False, True]
    assert ancestors[1, 3].tolist() == [True, False, True, True, False]
    assert ancestors[1, 4].tolist() == [True, False, True, False, True]


def test_rsd_over_a_nodes_first_children_only_emits_p():
    """60,000 rows: two real candidates of three (the third never drawn: the most likely token
    under p, put there by hand). With counts the emitted law is p; the control verifies the third
    as if it were drawn and must fail the same fit."""
    q = torch.tensor([0.7, 0.2, 0.05, 0.05], dtype=torch.float64)  # the draws are mostly rejected
    p = torch.tensor([0.05, 0.05, 0.2, 0.7], dtype=torch.float64)
    rows = 60000
    g = torch.Generator().manual_seed(1)
    first = draw_children(q.expand(rows, 1, 4), 2, g)[:, 0]
    prefer = torch.tensor([3, 2, 1, 0])  # the likeliest token under p that was not drawn
    spare = prefer[(first[:, :, None] != prefer).all(1).long().argmax(1)]
    candidates = torch.cat([first, spare[:, None]], 1)
    counts = torch.full((rows,), 2)
    args = (candidates, q.expand(rows, 4), p.expand(rows, 4), torch.Generator().manual_seed(2))
    fit = chi_square_fit(rsd_verify(*args, counts=counts).token[:, None], torch.arange(4)[:, None], p)
    assert fit.passed, fit
    control = rsd_verify(*args).token[:, None]
    assert not chi_square_fit(control, torch.arange(4)[:, None], p).passed


@pytest.mark.parametrize("static", [False, True])
def test_greedy_output_equals_ar_on_ragged_rows(static):
    target, prefix, ar = ragged_greedy_ar(static)
    drafter = FeatureDrafter(drafter_net(target), target, prefix)
    out, stats = decode_dynamic_tree(target, prefix, 12, GREEDY, drafter, depth=3, width=4)
    assert torch.equal(out, ar)
    assert stats.mode == "dynamic tree 3x4" and drafter.forwards > 0


def test_the_trees_first_path_is_the_chains_and_a_control_without_ancestors_fails():
    """Greedy, level 1's first slot is the root's most likely child, and wherever a level's first
    slot hangs under the first slot above, it is that node's most likely child: the chain drafter's
    drafts at the same step (asked first, on the same state), and the drafter's pass over that
    node predicts the feature the chain's pass over the same draft does. Checked at every step of
    a decode; the control hides each node's ancestors from it (the real columns and itself only),
    and its features must differ."""
    target = HFCausalLM(tiny_hf("llama", seed=3))
    prompt = torch.tensor([[3, 5, 7, 9]])

    def compared(blind: bool):
        net = drafter_net(target, seed=1)
        drafter = FeatureDrafter(net, target, prompt)
        chain_out, tree_out = [], []
        real_step, real_tree_step = net.step, net.tree_step

        def step(*args, **kwargs):
            chain_out.append(real_step(*args, **kwargs))
            return chain_out[-1]

        def tree_step(emb, feats, columns, slots, attend):
            if blind:
                key = torch.arange(attend.shape[-1])
                attend = attend & (key < attend.shape[-1] - drafter.tree_columns) | (key == slots[..., None])
            tree_out.append(real_tree_step(emb, feats, columns, slots, attend))
            return tree_out[-1]

        net.step, net.tree_step = step, tree_step
        real = drafter.propose_dynamic_tree
        tokens_same, features_same = [], []

        def both(tokens, n, depth, width, generator=None):
            before = drafter.consumed.clone()
            chain_out.clear()
            chain, _ = drafter.propose(tokens, n, depth)
            chain_steps = list(chain_out)  # the catch-up, then a pass per draft but the last
            drafter.consumed = before  # the tree catches up on the same columns again
            tree_out.clear()
            tree = real(tokens, n, depth, width, generator)
            for level in range(depth):
                if level and int(tree.parents[0, level, 0]) != 0:
                    break  # slot 0 is not under the first path here
                tokens_same.append(int(tree.tokens[0, level, 0]) == int(chain[0, level]))
                if level + 1 < depth:  # the pass over this node: the chain's pass over draft `level`
                    features_same.append(torch.allclose(tree_out[level][0, 0], chain_steps[-(depth - 1) + level][0, 0]))
            return tree

        drafter.propose_dynamic_tree = both
        decode_dynamic_tree(target, prompt, 16, GREEDY, drafter, depth=3, width=3)
        return tokens_same, features_same

    tokens_same, features_same = compared(blind=False)
    assert len(tokens_same) >= 20 and all(tokens_same)
    assert len(features_same) >= 10 and all(features_same)
    assert not all(compared(blind=True)[1])


def test_dynamic_tree_drafts_are_lossless():
    """8,000 sequences of 4 tokens in batches of 1,000 rows, trees of depth 2 and width 3 (every
    token top-k leaves possible); chi-square against the exact law. The control reports a uniform
    law for the same drafts and must fail."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    net = drafter_net(target, seed=3)
    sampling = SamplingConfig(temperature=0.8, top_k=3)

    class WrongLaw(FeatureDrafter):
        def propose_dynamic_tree(self, *a, **k):
            tree = super().propose_dynamic_tree(*a, **k)
            return DynamicTree(tree.tokens, tree.parents, torch.full_like(tree.q, 1 / tree.q.shape[-1]))

    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)
    tree = partial(decode_dynamic_tree, depth=2, width=3)
    drawn = sample_sequences(target, prompt_prefix, N, sampling, 8000, batch=1000, decode_fn=tree,
                             drafter_factory=lambda rows: FeatureDrafter(net, target, prompt_prefix(rows)))
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    control = sample_sequences(target, prompt_prefix, N, sampling, 8000, batch=1000, decode_fn=tree,
                               drafter_factory=lambda rows: WrongLaw(net, target, prompt_prefix(rows)))
    assert not chi_square_fit(control, seqs, probs).passed


def test_bad_tree_input_is_named():
    target = HFCausalLM(tiny_hf("llama"))
    prefix = ragged_prompts()
    drafter = FeatureDrafter(drafter_net(target), target, prefix)
    with pytest.raises(ValueError, match="tree width"):
        decode_dynamic_tree(target, prefix, 4, GREEDY, drafter, depth=2, width=0)
    with pytest.raises(ValueError, match="tree depth"):
        decode_dynamic_tree(target, prefix, 4, GREEDY, drafter, depth=0, width=2)
    chimera = ChimeraDrafter(drafter_net(target, cls=ChimeraDraftModel, heads=2), target, prefix)
    with pytest.raises(ValueError, match="Chimera"):
        decode_dynamic_tree(target, prefix, 4, GREEDY, chimera, depth=2, width=2)
    with pytest.raises(TypeError, match="dynamic draft tree"):
        decode_dynamic_tree(target, prefix, 4, GREEDY, object(), depth=2, width=2)


@pytest.mark.parametrize("compile", [False, True])
def test_generate_text_grows_dynamic_trees(compile, tokenizer):
    """Two ragged prompts, eager and compiled (the tree forward and the tree passes through their
    graphs): greedy output is the reference's, and the stats say the tree."""
    from conftest import generate_reference
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    net = drafter_net(HFCausalLM(model))
    out = generate_text(model, tokenizer, ["w1 w2 w3", "w4"], drafter=net, depth=3, tree_width=2, max_new_tokens=10,
                        temperature=0, compile=compile)
    assert out.stats.mode == "feature drafter" + ("+compiled" if compile else "") + " dynamic tree 3x2"
    for prompt, ids in zip(["w1 w2 w3", "w4"], out.token_ids):
        assert ids == generate_reference(model, tokenizer, prompt, 10)[:len(ids)]


def test_generate_text_names_bad_tree_arguments(tokenizer):
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    net = drafter_net(HFCausalLM(model))
    for kwargs, message in ((dict(tree_width=0, depth=2), "tree width"), (dict(tree_width=2), "tree depth"),
                            (dict(tree_width=2, depth=2, window=5), "takes no window"),
                            (dict(tree_width=2, depth=2, branches=2), "takes no branches"),
                            (dict(tree_width=2, depth=2, draft_vocab=16), "takes no draft_vocab")):
        with pytest.raises(ValueError, match=message):
            generate_text(model, tokenizer, "w1", drafter=net, max_new_tokens=4, **kwargs)
    with pytest.raises(ValueError, match="needs a feature drafter"):
        generate_text(model, tokenizer, "w1", drafter="ngram", depth=2, tree_width=2, max_new_tokens=4)


def test_a_compiled_tree_forward_equals_the_eager_one():
    """The target's tree forward through its compiled graph gives the eager forward's logits and
    features for a tree with per-row ancestors."""
    prefix = ragged_prompts()
    tree = DynamicTree(torch.tensor([[[4, 5], [6, 7]], [[8, 9], [10, 11]], [[12, 13], [14, 15]]]),
                       torch.tensor([[[0, 0], [0, 1]], [[0, 0], [1, 1]], [[0, 0], [0, 0]]]), None)
    depths, ancestors = tree.layout()
    tokens = torch.cat([torch.tensor([[3], [3], [3]]), tree.tokens.flatten(1)], 1)
    out = {}
    for compiled in (False, True):
        target = HFCausalLM(tiny_hf("llama"), static=True)
        calls = []
        if compiled:
            target.compile_step()
            target.precompile_tree(prefix, 8, tokens.shape[1], features=True)
            graph = target._tree_compiler.compiled
            target._tree_compiler.compiled = lambda *args: calls.append(1) or graph(*args)
        with torch.no_grad():  # as a decode runs it (a graph is per grad mode)
            target.prefill(prefix, 8)
            out[compiled] = target.forward_tree(tokens, depths, ancestors, torch.tensor([0, 0, 0]), features=True)
        assert len(calls) == int(compiled)  # through the graph precompile_tree compiled
    for compiled_part, eager_part in zip(out[True], out[False]):  # fused kernels round differently
        torch.testing.assert_close(compiled_part, eager_part, rtol=1e-5, atol=1e-5)
