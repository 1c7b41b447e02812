"""Draft trees verified in one target forward: tree attention equals running each chain alone,
greedy tree decoding equals transformers' generate, every multi-draft verifier is lossless through
the engine (exact enumeration vs chi-square, with a control that must fail), and bad trees are
named."""

from functools import partial

import pytest
import torch

from conftest import TEXT_PROMPTS, generate_reference, tiny_hf
from drafters.harness import FILTERED, PLAIN, PROMPT, SAMPLES, STAND_PROMPT, N, V
from drafters.harness import llama4  # noqa: F401 (a fixture, used by name)
from visualspec.drafters import DraftModelDrafter, StandDrafter
from visualspec.core.tree import decode_tree
from visualspec.models.hf import HFCausalLM
from visualspec.core.multidraft import DraftTree, recursive_iid_verify, rsd_verify, spectr_verify
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.text import generate_text

PROMPTS = TEXT_PROMPTS


# ----------------------------------------------------------------------------------------------
# tree attention
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_one_tree_forward_equals_each_chain_alone_and_keep_leaves_the_picked_path(family, static):
    model = tiny_hf(family)
    ids = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 7, 8, 9]])  # row 0 is left-padded
    prefix = (ids, torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
    k, L, start = 3, 3, 2
    generated = torch.tensor([[11, 12], [13, 14]])  # two committed tokens; the root is the second
    tree = DraftTree(torch.randint(2, 64, (2, k, L), generator=torch.Generator().manual_seed(0)), None, None, "greedy")
    depths, ancestors = tree.layout()

    target = HFCausalLM(model, static=static)
    target.prefill(prefix, 8)
    target.forward_window(generated[:, :1], 0)
    flat = torch.cat([generated[:, 1:], tree.tokens.flatten(1)], 1)
    logits = target.forward_tree(flat, depths, ancestors, start - 1)

    for j in range(k):
        alone = HFCausalLM(model)
        alone.prefill(prefix, 8)
        ref = alone.forward_window(torch.cat([generated, tree.tokens[:, j]], 1), 0)[:, 1:]
        nodes = [0] + [1 + j * L + d for d in range(L)]
        torch.testing.assert_close(logits[:, nodes], ref, rtol=1e-9, atol=1e-9)

    # keep chain 1 for row 0 and chain 2 for row 1, two tokens deep: the cache is that path
    path = torch.tensor([[0, 1 + L, 2 + L], [0, 1 + 2 * L, 2 + 2 * L]])
    target.keep(path, torch.tensor([3, 3]))
    nxt = torch.tensor([[20], [21]])
    after = target.forward_window(nxt, start + 2)
    alone = HFCausalLM(model)
    alone.prefill(prefix, 8)
    picked = torch.stack([tree.tokens[0, 1, :2], tree.tokens[1, 2, :2]])
    ref = alone.forward_window(torch.cat([generated, picked, nxt], 1), 0)[:, -1:]
    torch.testing.assert_close(after, ref, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------------------
# greedy equality
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter, branches", [("model", 2), ("model", 3), ("stand", 2)])
def test_greedy_tree_decoding_equals_generate(family, drafter, branches, tokenizer):
    model = tiny_hf(family)
    draft = tiny_hf(family, seed=1) if drafter == "model" else "stand"
    out = generate_text(model, tokenizer, PROMPTS, drafter=draft, branches=branches, window=7, max_new_tokens=20,
                        temperature=0, ngram=2)
    for prompt, ids in zip(PROMPTS, out.token_ids):
        ref = generate_reference(model, tokenizer, prompt, 20)
        assert ids == ref[: len(ids)] and (len(ids) == 20 or ids[-1] == tokenizer.eos_token_id)
    assert out.stats.target_forwards <= 20 and "tree" in out.stats.mode


def test_a_draft_of_the_target_itself_is_accepted_whole(tokenizer):
    """Greedy, the draft model is the target: every first candidate list holds the argmax, and every
    chain is accepted to its end (depth + 1 tokens per forward)."""
    model = tiny_hf("llama")
    out = generate_text(model, tokenizer, PROMPTS[0], drafter=model, branches=2, window=7, max_new_tokens=25,
                        temperature=0)
    assert out.stats.accepted_lengths[:-1] == [4] * (len(out.stats.accepted_lengths) - 1)


# ----------------------------------------------------------------------------------------------
# losslessness under sampling
# ----------------------------------------------------------------------------------------------


def tree_fit(target, sampling, drafter_factory, rule, prompt=PROMPT, branches=2, depth=2, samples=SAMPLES):
    make_prefix = lambda rows: torch.tensor([prompt]).expand(rows, len(prompt))  # noqa: E731
    seqs, probs = exact_sequence_distribution(target, make_prefix, N, sampling)
    drawn = sample_sequences(target, make_prefix, N, sampling, samples, drafter_factory=drafter_factory,
                             decode_fn=partial(decode_tree, branches=branches, depth=depth, rule=rule))
    return chi_square_fit(drawn, seqs, probs)


def draft_model(draft, scheme):
    def make(rows):
        return DraftModelDrafter(HFCausalLM(draft), torch.tensor([PROMPT]).expand(rows, len(PROMPT)), tree_scheme=scheme)
    return make


@pytest.mark.parametrize("rule, scheme, sampling", [
    (rsd_verify, "without_replacement", PLAIN), (spectr_verify, "iid", FILTERED)],
    ids=["rsd", "spectr-temperature-topk-topp"])
def test_draft_model_trees_are_lossless(rule, scheme, sampling, llama4):
    """(recursive_iid_verify's law is proved exactly in test_multidraft; here the engine around the
    rules: tree attention, chain verification after the picked branch, cache keep.)"""
    target, draft = llama4
    fit = tree_fit(target, sampling, draft_model(draft, scheme), rule)
    assert fit.passed, fit


def test_stand_trees_are_lossless(llama4):
    target, _ = llama4
    fit = tree_fit(target, PLAIN, lambda rows: StandDrafter([STAND_PROMPT] * rows, V, max_ngram=2), rsd_verify,
                   prompt=STAND_PROMPT, branches=2, depth=2)
    assert fit.passed, fit


def test_the_harness_catches_a_verifier_that_assumes_the_wrong_draft_scheme(llama4):
    """Drafts drawn without replacement but verified as if i.i.d.: the second candidate's law is
    wrong, and the sequence distribution moves far outside the chi-square bound."""
    target, draft = llama4
    fit = tree_fit(target, PLAIN, draft_model(draft, "without_replacement"), recursive_iid_verify)
    assert not fit.passed, fit


# ----------------------------------------------------------------------------------------------
# bad trees
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(drafter="stand", branches=0), "branches"),
    (dict(drafter="stand", branches=2, depth=4, window=8), "larger than the window"),
    (dict(drafter="stand", branches=8, window=8), "depth >= 1"),
    (dict(drafter="ngram", branches=2), "needs a draft model or drafter='stand'"),
    (dict(drafter="stand", branches=2, multidraft="spectr"), "without replacement"),
    (dict(drafter="stand", branches=2, multidraft="best"), "unknown multidraft"),
    (dict(drafter="stand", branches=2, acceptance="typical"), "verified exactly"),
    (dict(drafter="stand", depth=2), "depth is for draft trees"),
])
def test_bad_trees_are_named(kwargs, message, tokenizer):
    with pytest.raises(ValueError, match=message):
        generate_text(tiny_hf("llama"), tokenizer, PROMPTS[0], max_new_tokens=4, **kwargs)
