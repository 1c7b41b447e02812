"""The Chimera drafter (#50): a trigram encoder, the EAGLE layer over the target's features and
residual heads that draft several tokens from one pass. Its pairs read the right tokens and
features (an alignment test with a control one token off), greedy decoding equals AR on ragged
rows (through a queue in the feature drafter's tests), one drafter pass drafts a whole step, and
its sampled drafts keep decoding lossless (chi-square, with a control that must fail)."""

import pytest
import torch

from conftest import tiny_hf
from drafters.harness import (N, V, drafter_net, prompt_prefix, ragged_greedy_ar, ragged_prompts,
                             reporting_uniform_law)
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import ChimeraDrafter, FeatureDrafter
from visualspec.models.chimera import ChimeraDraftModel, trigrams
from visualspec.models.feature_drafter import FeatureDraftModel, load_draft_model
from visualspec.models.hf import HFCausalLM

GREEDY = SamplingConfig(temperature=0.0)


def chimera_net(target: HFCausalLM, seed=0, heads=3, dtype=torch.float64):
    return drafter_net(target, seed, dtype, cls=ChimeraDraftModel, heads=heads)


def test_trigrams_are_each_columns_last_three_tokens():
    x = torch.tensor([[5, 6, 7, 8]])
    assert trigrams(x).tolist() == [[[5, 5, 5], [5, 5, 6], [5, 6, 7], [6, 7, 8]]]
    assert trigrams(x, torch.tensor([[1, 2]]))[0, :2].tolist() == [[1, 2, 5], [2, 5, 6]]


@pytest.mark.parametrize("static", [False, True])
def test_greedy_output_equals_ar_on_ragged_rows_with_one_pass_a_step(static):
    target, prefix, ar = ragged_greedy_ar(static)
    drafter = ChimeraDrafter(chimera_net(target), target, prefix)
    steps = []
    real = drafter.propose
    drafter.propose = lambda tokens, n, k, g=None: steps.append(real(tokens, n, k, g)) or steps[-1]
    out, stats = decode(target, prefix, 12, GREEDY, drafter=drafter, window=8)
    assert torch.equal(out, ar) and stats.target_forwards < 12 * 3
    assert {d.shape[1] for d, _ in steps} == {3}  # window 8 asks for 7 drafts; 3 heads draft 3
    assert drafter.forwards == len(steps) + 1  # the prompt's pass, then one pass a step
    torch.manual_seed(0)  # the control: an EAGLE drafter runs a pass per draft after the first
    eagle = FeatureDrafter(FeatureDraftModel(feature_size=target.feature_size, n_head=4, ffn_hidden=64,
                                             max_len=128).double().eval(), target, prefix)
    _, eagle_stats = decode(target, prefix, 12, GREEDY, drafter=eagle, window=4)
    assert eagle.forwards - 1 >= 2 * (eagle_stats.target_forwards - 1)


def test_each_pair_reads_its_own_trigram_and_feature_and_a_shifted_control_fails():
    """Every pass's pairs are recorded: the pair at generated position g must hold the tokens at
    g-2, g-1, g (the prompt's last tokens before 0) and the target's feature of position g-1, and
    the heads of a step at n must read the target's newest feature, that of position n-2. The
    controls hand each pair the trigram one position later, and the heads the feature one
    position earlier, and the checks must fail."""
    target = HFCausalLM(tiny_hf("llama", seed=3))
    prompt = torch.tensor([[3, 5, 7, 9]])
    P = prompt.shape[1]

    def check(cls):
        seen, heads = [], []
        net = chimera_net(target)
        real_heads = net.head_features
        net.head_features = lambda features, out: heads.append(features.clone()) or real_heads(features, out)

        class Recording(cls):
            def _step(self, tokens, features, columns, rows=None, compiled=True):
                seen.append((tokens.clone(), features.clone(), columns.clone()))
                return super()._step(tokens, features, columns, rows, compiled)

            def propose(self, tokens, n, k, generator=None):
                heads.append(int(n[0]))
                return super().propose(tokens, n, k, generator)

        out, _ = decode(target, prompt, 12, GREEDY, drafter=Recording(net, target, prompt), window=3)
        full = torch.cat([prompt[0], out[0]])
        _, features = target.prefill(torch.cat([prompt, out[:, :-1]], 1), 1, features=True)
        pairs = []
        for tokens, feats, columns in seen[1:]:  # passes over generated positions
            for j, column in enumerate(columns[0].tolist()):
                pairs.append(tokens[0, j].tolist() == full[column - 2:column + 1].tolist()
                             and torch.allclose(feats[0, j], features[0, column - 1].to(feats.dtype)))
        newest = [torch.allclose(f[0], features[0, P + n - 2].to(f.dtype)) for n, f in zip(heads[::2], heads[1::2])]
        return all(pairs), all(newest) and len(newest) > 3

    assert check(ChimeraDrafter) == (True, True)

    class OneLater(ChimeraDrafter):
        def _generated_inputs(self, tokens, g):
            return super()._generated_inputs(tokens, (g + 1).clamp(max=tokens.shape[1] - 1))

    assert check(OneLater)[0] is False

    class OlderFeature(ChimeraDrafter):
        def _catch_up(self, tokens, n):
            last, nm = super()._catch_up(tokens, n)
            self.real = self.real.roll(1, 1)  # position n-2's feature where n-3's was
            return last, nm

    assert check(OlderFeature)[1] is False


def test_rows_that_stop_early_leave_each_survivor_its_own_trigram_start():
    """Row 1 stops at its third token (EOS is the token AR gives it there) and the engine drops it:
    the drafter keeps, for the rows left, their own prompts' last two tokens (the trigram before
    generated position 0), and greedy output still equals AR's, stop included."""
    target = HFCausalLM(tiny_hf("llama"))
    ids, mask = ragged_prompts()
    ar, _ = decode(target, (ids, mask), 12, GREEDY)
    eos = int(ar[1, 2])
    assert all(eos not in ar[r, :3].tolist() for r in (0, 2))  # the others run on past it
    ar_stopped, _ = decode(target, (ids, mask), 12, GREEDY, stop_token=eos)
    drafter = ChimeraDrafter(chimera_net(target), target, (ids, mask))
    kept = []
    real = drafter.select
    drafter.select = lambda rows: (real(rows), kept.append((rows.tolist(), drafter._before.tolist())))
    out, _ = decode(target, (ids, mask), 12, GREEDY, drafter=drafter, window=4, stop_token=eos)
    assert torch.equal(out, ar_stopped)
    assert kept and kept[0][0] == [0, 2] and kept[0][1] == [ids[0, -2:].tolist(), ids[2, -2:].tolist()]


def test_chimera_drafts_are_lossless():
    """8,000 sequences of 4 tokens in batches of 1,000 rows, window 4 (three heads); chi-square
    against the exact law, bound from the sample size. The control reports a uniform law for
    the same drafts, and the fit must fail."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    net = chimera_net(target, seed=3)
    sampling = SamplingConfig(temperature=0.8, top_k=3)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)
    drawn = sample_sequences(target, prompt_prefix, N, sampling, 8000, batch=1000, window=4,
                             drafter_factory=lambda rows: ChimeraDrafter(net, target, prompt_prefix(rows)))
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    WrongLaw = reporting_uniform_law(ChimeraDrafter)
    control = sample_sequences(target, prompt_prefix, N, sampling, 8000, batch=1000, window=4,
                               drafter_factory=lambda rows: WrongLaw(net, target, prompt_prefix(rows)))
    assert not chi_square_fit(control, seqs, probs).passed


def test_a_saved_chimera_loads_as_itself_and_bad_input_is_named(tmp_path):
    target = HFCausalLM(tiny_hf("llama"))
    net = chimera_net(target, heads=2, dtype=torch.float32)
    net.save_pretrained(tmp_path / "chimera")
    loaded = load_draft_model(tmp_path / "chimera")
    assert isinstance(loaded, ChimeraDraftModel) and loaded.config.heads == 2
    assert isinstance(FeatureDrafter.for_model(loaded, target), ChimeraDrafter)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"_class_name": "LlamaForCausalLM"}')
    with pytest.raises(ValueError, match="not a feature drafter"):
        load_draft_model(tmp_path / "other")
    with pytest.raises(ValueError, match="at least one head"):
        ChimeraDraftModel(feature_size=32, heads=0)
