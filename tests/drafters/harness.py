"""The losslessness harness's shared pieces: sizes, sampling settings, prompts and prefixes, a
wrong acceptance rule used as a control, the ragged-batch helpers (labels, generators, a
Jacobi drafter) and the feature drafters' (left-padded prompts, a small network)."""

import pytest
import torch

from conftest import tiny_hf, tiny_llamagen
from visualspec.core.sampling import SamplingConfig
from visualspec.core.verify import Verdict
from visualspec.drafters import JacobiDrafter
from visualspec.models.feature_drafter import FeatureDraftModel
from visualspec.models.hf import HFCausalLM

# ------------------------------------------------------------------ exact-enumeration harness

N, V, SAMPLES = 4, 4, 24000  # 4 tokens of a 4-token vocabulary (256 sequences), 24,000 samples per fit
PLAIN = SamplingConfig()
GUIDED = SamplingConfig(guidance_scale=2.5, temperature=0.8, top_k=3, top_p=0.95)
FILTERED = SamplingConfig(temperature=0.8, top_k=3, top_p=0.95)
PROMPT = [0, 2, 1]
STAND_PROMPT = [1, 0, 2, 0, 1]  # contexts with several successors: many STAND drafts are random (20-60%)


def labels_prefix(sampling, label=1):
    def make(rows):
        labels = [label] * rows + ([3] * rows if sampling.uses_guidance else [])  # 3 = null class
        return torch.tensor(labels)
    return make


def prompt_prefix(rows):
    """PROMPT for each of ``rows`` rows, as a causal LM's prefix."""
    return torch.tensor([PROMPT]).expand(rows, len(PROMPT))


def reporting_uniform_law(drafter_class):
    """A control drafter: ``drafter_class``'s drafts, reported as drawn from the uniform law, so
    the rule accepts and resamples against the wrong q and a fit of its output must fail."""
    class WrongLaw(drafter_class):
        def propose(self, tokens, n, k, generator=None):
            drafts, q = super().propose(tokens, n, k, generator)
            return drafts, torch.full_like(q, 1 / q.shape[-1])
    return WrongLaw


def accept_with_p_rule(draft_tokens, draft_probs, target_probs, generator):
    """A deliberately wrong rule: accept with p(x) instead of min(1, p(x)/q(x)), residual as usual."""
    n = draft_tokens.shape[0]
    p_x = target_probs[:, 0].gather(-1, draft_tokens).squeeze(-1)
    accept = torch.rand(n, generator=generator, dtype=torch.float64) < p_x.double()
    residual = (target_probs[:, 0] - draft_probs[:, 0]).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), target_probs[:, 0])
    resampled = torch.multinomial(residual, 1, generator=generator)[:, 0]
    return Verdict(accept.long(), resampled)


@pytest.fixture(scope="module")
def llama4():
    """Target and draft: two different tiny Llamas over V = 4 tokens (the draft puts 0.57 on token 2
    after PROMPT)."""
    return HFCausalLM(tiny_hf("llama", vocab_size=V)), tiny_hf("llama", seed=2, vocab_size=V)


# ------------------------------------------------------------------------------ ragged batches

RAGGED_GUIDED = SamplingConfig(guidance_scale=2.0, temperature=0.9)


def class_labels(ids, sampling):
    """Class labels ``id % 3`` of the rows ``ids``, then as many null labels (3) under guidance."""
    labels = torch.tensor([i % 3 for i in ids])
    return torch.cat([labels, torch.full_like(labels, 3)]) if sampling.uses_guidance else labels


def generators(seeds=(0, 1, 2)):
    """One seeded generator per row."""
    return [torch.Generator().manual_seed(s) for s in seeds]


def jacobi(coupling=False):
    """The ragged tests' Jacobi drafter over 16 tokens."""
    return JacobiDrafter(16, "repeat_above", grid_width=4, coupling=coupling)


def ragged_prompts():
    """Three left-padded prompts of 3, 5 and 2 tokens and their attention mask."""
    ids = torch.tensor([[0, 0, 4, 5, 6], [7, 8, 9, 10, 11], [0, 0, 0, 12, 13]])
    return ids, (ids != 0).long()


def queued_greedy_ar(num_tokens: int = 10):
    """Continuous batching's case: a tiny Llama target, six ragged prompts queued for two slots
    (``Requests``), each request's prompt as a function of the request indices (what a feature
    drafter reads), and the target's greedy AR tokens of all six decoded at once."""
    from visualspec.core.engine import Requests, decode

    target = HFCausalLM(tiny_hf("llama"))
    ids, mask = ragged_prompts()
    ids, mask = torch.cat([ids, ids.flip(0)]), torch.cat([mask, mask.flip(0)])
    ar, _ = decode(target, (ids, mask), num_tokens, SamplingConfig(temperature=0.0))
    return target, Requests(count=6, prefix=lambda r: (ids[r], mask[r]), slots=2), lambda r: (ids[r], mask[r]), ar


def ragged_greedy_ar(static: bool = False, num_tokens: int = 12):
    """A tiny Llama target (a static cache or not), :func:`ragged_prompts` and the target's greedy
    AR tokens after them, which every lossless drafter must reproduce."""
    from visualspec.core.engine import decode

    target = HFCausalLM(tiny_hf("llama"), static=static)
    prefix = ragged_prompts()
    return target, prefix, decode(target, prefix, num_tokens, SamplingConfig(temperature=0.0))[0]


def drafter_net(target: HFCausalLM, seed=0, dtype=torch.float64, cls=FeatureDraftModel, **kwargs):
    """A small ``cls`` network for ``target`` (the EAGLE drafter's, or a subclass with ``kwargs``)
    with large random weights, so its drafts vary."""
    torch.manual_seed(seed)
    net = cls(feature_size=target.feature_size, n_head=4, ffn_hidden=64, max_len=128, **kwargs)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return net.to(dtype).eval()


class CopyingDraftModel(FeatureDraftModel):
    """A feature drafter network that returns the feature it is fed (its cache still written): it
    drafts the target's own prediction of the position before, so its drafts show whether each
    position's real feature reached it."""

    def step(self, embeddings, features, columns, **options):
        super().step(embeddings, features, columns, **options)
        return features


def copying_net(target) -> CopyingDraftModel:
    """A :class:`CopyingDraftModel` for ``target``, in float64."""
    return CopyingDraftModel(feature_size=target.feature_size, n_head=4, ffn_hidden=64, max_len=128).double()


class NoFeatures:
    """A token model that only gives logits (no ``feature_size``): what a feature reader refuses."""
    vocab_size = 16

    def __init__(self):
        self.model = tiny_llamagen(vocab_size=16, block_size=16)

    def prefill(self, prefix, n):
        return self.model.prefill(prefix, n)


def guided_llamagen_ar(compiled: bool, features=True):
    """A tiny LlamaGen GPT, class labels for two rows and their unconditional twins, greedy sampling
    under guidance and the GPT's AR output; ``compiled``: its step compiled first, for windows 1
    and 3 returning ``features`` (a feature drafter's request) and for AR's window 1."""
    from visualspec.core.engine import decode

    target = tiny_llamagen(vocab_size=16, block_size=16, dim=32, std=0.1)
    labels = torch.tensor([0, 1, 3, 3])
    sampling = SamplingConfig(temperature=0.0, guidance_scale=2.0)
    if compiled:
        target.compile_step()
        target.precompile(labels, 16, [1, 3], features=features)
        target.precompile(labels, 16, [1])
    return target, labels, sampling, decode(target, labels, 16, sampling)[0]
