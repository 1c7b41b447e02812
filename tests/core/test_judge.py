"""Judge decoding: the rule (judge_verify) step by step, and JudgeRule in the engine, where it
reads the target's own features of the verified window."""

import pytest
import torch

from conftest import tiny_llamagen
from drafters.harness import PLAIN, RAGGED_GUIDED as GUIDED, NoFeatures
from drafters.harness import class_labels as _labels, generators as _generators, jacobi as _jacobi
from visualspec.core.engine import Requests, decode
from visualspec.core.judge import JudgeRule
from visualspec.core.lossless import chi_square_fit
from visualspec.core.rows import _Run
from visualspec.core.sampling import SamplingConfig
from visualspec.core.verify import judge_verify, point_mass, speculative_verify

V = 6

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny CPU workloads


def _step(seed, rows, k):
    """Target laws p (rows, k + 1, V), draft laws q (rows, k, V) and drafts drawn from q."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(rows, k + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(rows, k, V, generator=g, dtype=torch.float64), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(rows, k)
    return p, q, drafts


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _exact_accepts(drafts, q, p, seed):
    """Which drafts exact speculative sampling accepts under the first uniforms of ``seed``
    (the rule draws one per draft before anything else)."""
    u = torch.rand(drafts.shape, generator=_gen(seed), dtype=torch.float64)
    q_x = torch.ones(drafts.shape, dtype=torch.float64) if q is None else q.gather(-1, drafts[..., None])[..., 0]
    p_x = p[:, :-1].gather(-1, drafts[..., None])[..., 0]
    return (q_x > 0) & (u * q_x < p_x)


# ------------------------------------------------------------------------------ the rule

@pytest.mark.parametrize("draft", ["sampled", "point-mass", "one-hot"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_threshold_one_is_exact_speculative_sampling(draft, seed):
    p, q, drafts = _step(seed, 256, 3)
    q = {"sampled": q, "point-mass": None, "one-hot": point_mass(drafts, V).double()}[draft]
    scores = torch.rand(drafts.shape, generator=_gen(100 + seed), dtype=torch.float64)
    scores[::3] = 1.0  # the largest score a judge gives: still not above the threshold
    exact = speculative_verify(drafts, q, p, _gen(seed))
    judged = judge_verify(drafts, q, p, _gen(seed), scores=scores, threshold=1.0)
    assert torch.equal(judged.num_accepted, exact.num_accepted)
    assert torch.equal(judged.next_tokens, exact.next_tokens)
    assert judged.judged.shape == drafts.shape and not judged.judged.any()
    assert 0 < int(exact.num_accepted.sum()) < 256 * 3  # both accepting and rejecting are exercised
    # the control: a threshold just below the top score changes verdicts
    lower = judge_verify(drafts, q, p, _gen(seed), scores=scores, threshold=0.99)
    assert not torch.equal(lower.num_accepted, exact.num_accepted)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("draft", ["sampled", "point-mass"])
def test_the_judge_never_accepts_less_than_the_exact_rule(draft, threshold):
    p, q, drafts = _step(3, 512, 4)
    q = q if draft == "sampled" else None
    scores = torch.rand(drafts.shape, generator=_gen(7), dtype=torch.float64)
    exact = speculative_verify(drafts, q, p, _gen(11))
    v = judge_verify(drafts, q, p, _gen(11), scores=scores, threshold=threshold)
    assert (v.num_accepted >= exact.num_accepted).all()
    assert (v.num_accepted > exact.num_accepted).any()  # the judge does keep some the exact rule drops
    # judged: exactly the accepted drafts the exact rule rejected with these uniforms
    positions = torch.arange(4)[None] < v.num_accepted[:, None]
    assert torch.equal(v.judged, positions & ~_exact_accepts(drafts, q, p, 11))
    assert (scores[v.judged] > threshold).all()
    # a row where the judge kept nothing stops where the exact rule does, with the same token
    plain = ~v.judged.any(1)
    assert (~plain).any() and (plain.any() or threshold == 0)  # at 0 every draft scores above it
    assert torch.equal(v.num_accepted[plain], exact.num_accepted[plain])
    assert torch.equal(v.next_tokens[plain], exact.next_tokens[plain])


@pytest.mark.parametrize("draft", ["sampled", "point-mass"])
def test_scores_above_the_threshold_accept_every_draft_and_the_bonus_comes_from_p_k(draft):
    rows, k = 64, 3
    p, q, drafts = _step(5, rows, k)
    q = q if draft == "sampled" else None
    bonus = torch.arange(rows) % V
    p[:, k] = point_mass(bonus, V).double()
    v = judge_verify(drafts, q, p, _gen(2), scores=torch.ones(rows, k, dtype=torch.float64), threshold=0.5)
    assert (v.num_accepted == k).all()
    assert torch.equal(v.next_tokens, bonus)
    exact = _exact_accepts(drafts, q, p, 2)
    assert torch.equal(v.judged, ~exact) and v.judged.any() and (~v.judged).any()


def _stop_at_position_one(rows):
    """Two drafts per row that the exact rule always rejects (p(x) = 0), the judge scoring the
    first above the threshold and the second below: the step stops at position 1. Laws of rows 0,
    1 and the bonus row all differ, so a residual of the wrong row is told apart."""
    p = torch.tensor([[0.00, 0.10, 0.20, 0.30, 0.40, 0.00],
                      [0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
                      [0.00, 1.00, 0.00, 0.00, 0.00, 0.00]], dtype=torch.float64)
    q = torch.tensor([[0.50, 0.10, 0.10, 0.10, 0.10, 0.10],
                      [0.05, 0.30, 0.10, 0.20, 0.05, 0.30]], dtype=torch.float64)
    drafts = torch.tensor([[0, 5]]).expand(rows, 2)
    scores = torch.tensor([[0.9, 0.1]], dtype=torch.float64).expand(rows, 2)
    return p.expand(rows, 3, V), q.expand(rows, 2, V), drafts, scores


def test_a_draft_only_the_judge_accepts_is_counted_and_the_step_stops_where_both_reject():
    p, q, drafts, scores = _stop_at_position_one(32)
    v = judge_verify(drafts, q, p, _gen(0), scores=scores, threshold=0.5)
    assert (v.num_accepted == 1).all()
    assert torch.equal(v.judged, torch.tensor([[True, False]]).expand(32, 2))
    assert int(v.judged.sum()) == 32  # one judged draft a row
    # below the judge's score the first draft is rejected too: nothing accepted, nothing judged
    v = judge_verify(drafts, q, p, _gen(0), scores=scores, threshold=0.95)
    assert (v.num_accepted == 0).all() and not v.judged.any()


def test_the_token_emitted_at_the_stop_is_the_exact_rules_residual_sample():
    n = 6_000
    p, q, drafts, scores = _stop_at_position_one(n)
    v = judge_verify(drafts, q, p, _gen(1), scores=scores, threshold=0.5)
    assert (v.num_accepted == 1).all()
    emitted = v.next_tokens
    assert (emitted != drafts[:, 1]).all(), "the rejected draft was emitted"
    residual = (p[0, 1] - q[0, 1]).clamp(min=0)
    residual /= residual.sum()  # [0.625, 0, 0.25, 0, 0.125, 0]
    tokens = torch.arange(V)[:, None]
    assert chi_square_fit(emitted[:, None], tokens, residual).passed
    # controls the same sample fails: p at the stop itself, and the residual of the row before it
    assert not chi_square_fit(emitted[:, None], tokens, p[0, 1]).passed
    row0 = (p[0, 0] - q[0, 0]).clamp(min=0)
    assert not chi_square_fit(emitted[:, None], tokens, row0 / row0.sum()).passed


@pytest.mark.parametrize("threshold", [-0.1, 1.5, True, "a", float("nan"), None])
def test_a_bad_threshold_is_named(threshold):
    p, q, drafts = _step(0, 4, 2)
    scores = torch.full(drafts.shape, 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"the judge's threshold must be a number in \[0, 1\]"):
        judge_verify(drafts, q, p, _gen(0), scores=scores, threshold=threshold)
    with pytest.raises(ValueError, match=r"the judge's threshold must be a number in \[0, 1\]"):
        JudgeRule(lambda *a: scores, threshold)


@pytest.mark.parametrize("shape", [(4,), (4, 3), (2, 2), (4, 2, 1)])
def test_scores_of_the_wrong_shape_are_named(shape):
    p, q, drafts = _step(0, 4, 2)
    with pytest.raises(ValueError, match=r"scores must have the drafts' shape \(4, 2\), got"):
        judge_verify(drafts, q, p, _gen(0), scores=torch.zeros(shape), threshold=0.5)


def test_no_drafts_is_one_autoregressive_step():
    p, _, _ = _step(0, 16, 0)
    empty = torch.zeros(16, 0, dtype=torch.long)
    a = speculative_verify(empty, None, p, _gen(0))
    b = judge_verify(empty, None, p, _gen(0), scores=torch.zeros(16, 0), threshold=0.0)
    assert torch.equal(a.next_tokens, b.next_tokens) and (b.num_accepted == 0).all()


# ------------------------------------------------------------------------------ the engine

MODEL = dict(seed=2, vocab_size=16, block_size=16, std=0.3)
IDS = list(range(6))


def _ones(features, drafts, target_probs):
    return torch.ones(drafts.shape, dtype=torch.float64)


def _by_features(features, drafts, target_probs):
    """A judge that depends on each draft's own feature only: some drafts pass 0.5, some do not."""
    return torch.sigmoid(4 * features[..., 0])


def _decode(model, rule=None, prefix=None, sampling=GUIDED):
    prefix = _labels(IDS, sampling) if prefix is None else prefix
    return decode(model, prefix, 16, sampling, drafter=_jacobi(), rule=rule, window=5, generator=_generators(IDS))


def test_threshold_one_decodes_as_the_exact_rule():
    model = tiny_llamagen(**MODEL)
    exact, exact_stats = _decode(model)
    judged, stats = _decode(model, JudgeRule(_ones, 1.0))
    assert torch.equal(judged, exact)
    assert torch.equal(stats.fixed_at, exact_stats.fixed_at)
    assert stats.judged_tokens == 0 and stats.judged_at.shape == (6, 16) and not stats.judged_at.any()
    assert exact_stats.judged_at is None and "judged_tokens" not in stats.to_dict()
    # the control: below the scores the judge keeps drafts, and the tokens change
    relaxed, _ = _decode(model, JudgeRule(_ones, 0.99))
    assert not torch.equal(relaxed, exact)


@pytest.fixture
def steps(monkeypatch):
    """Each verified step of a decode: its rows' requests and committed counts, the drafts and the
    verdict (the rule's call is wrapped, so the records line up with the score's calls)."""
    records = []
    verify = _Run.verify

    def recorded(self, drafts, draft_probs, target_probs, features):
        verdict = verify(self, drafts, draft_probs, target_probs, features)
        if drafts.shape[1]:
            records.append(dict(req=self.rows.req.clone(), n=self.rows.n.clone(), drafts=drafts.clone(),
                                accepted=verdict.num_accepted.clone(), judged=verdict.judged.clone(),
                                model_rows=features.shape[0]))
        return verdict

    monkeypatch.setattr(_Run, "verify", recorded)
    return records


def test_the_judge_reads_each_drafts_own_feature_of_the_conditional_rows(steps):
    """The score gets (B, K, D) features of the B sample rows (not the 2B model rows under
    guidance); where a draft was accepted, its feature is the target's teacher-forced feature
    of the committed tokens at the draft's own column (the one that reads the draft and predicts
    the next position). Compared one column off, or with the unconditional rows', they differ."""
    model = tiny_llamagen(**MODEL)
    given = []

    def score(features, drafts, target_probs):
        given.append((features.clone(), target_probs.clone()))
        return _by_features(features, drafts, target_probs)

    tokens, stats = _decode(model, JudgeRule(score, 0.5))
    assert len(given) == len(steps) > 0 and stats.judged_tokens > 0
    with torch.no_grad():
        cond = model(torch.tensor([i % 3 for i in IDS]), tokens, features=True)  # (6, 16, D): column m reads token m - 1
        uncond = model(torch.full((6,), 3), tokens, features=True)
    D = model.feature_size
    assert given[0][0].shape == (6, 4, D) and steps[0]["model_rows"] == 12
    compared = 0
    for (features, target_probs), step in zip(given, steps):
        assert features.shape == (len(step["req"]), 4, D) and target_probs.shape == (len(step["req"]), 4, 16)
        for row, (req, n, a) in enumerate(zip(step["req"].tolist(), step["n"].tolist(), step["accepted"].tolist())):
            for i in range(a):
                if n + i >= 16:
                    break  # past the row's end: filler drafts, never committed
                assert tokens[req, n + i] == step["drafts"][row, i]  # an accepted draft is the committed token
                if n + i + 1 >= 16:
                    continue  # the last token's own feature predicts nothing in the image
                torch.testing.assert_close(features[row, i], cond[req, n + i + 1])
                assert (features[row, i] - cond[req, n + i]).abs().max() > 1e-3  # one column off
                assert (features[row, i] - uncond[req, n + i + 1]).abs().max() > 1e-3  # the unconditional row's
                compared += 1
    assert compared > 20, compared


def test_a_judge_that_keeps_every_draft_accepts_more_and_says_where():
    model = tiny_llamagen(**MODEL)
    _, exact = _decode(model)
    _, stats = _decode(model, JudgeRule(_ones, 0.0))
    assert stats.judged_tokens > 0 and stats.judged_tokens == int(stats.judged_at.sum())
    assert stats.mean_accepted > exact.mean_accepted
    assert stats.target_forwards < exact.target_forwards
    assert not stats.judged_at[:, 0].any()  # token 0 is the prefill's, never a draft
    assert stats.to_dict()["judged_tokens"] == stats.judged_tokens and "judged_at" not in stats.to_dict()


@pytest.mark.parametrize("sampling", [PLAIN, GUIDED], ids=["plain", "guided"])
def test_a_judge_decodes_ragged_rows_alike_in_a_batch_and_in_a_queue(sampling, steps):
    model = tiny_llamagen(**MODEL)
    rule = JudgeRule(_by_features, 0.5)
    batch, stats = _decode(model, rule, sampling=sampling)
    assert stats.row_forwards.unique().numel() > 1, "rows must accept different counts"
    assert stats.judged_tokens > 0
    steps.clear()
    queued, qstats = _decode(model, rule, Requests(6, lambda rows: _labels(rows, sampling), slots=2), sampling)
    assert qstats.slots == 2
    assert torch.equal(queued, batch)
    assert torch.equal(qstats.row_forwards, stats.row_forwards)
    assert torch.equal(qstats.judged_at, stats.judged_at) and qstats.judged_tokens == stats.judged_tokens
    # the judged map is where the verdicts said, request by request, though rows moved between slots
    expected = torch.zeros(6, 16, dtype=torch.bool)
    for step in steps:
        for row, (req, n) in enumerate(zip(step["req"].tolist(), step["n"].tolist())):
            for i in step["judged"][row].nonzero()[:, 0].tolist():
                if n + i < 16:
                    expected[req, n + i] = True
    assert torch.equal(qstats.judged_at, expected)


def test_the_rule_is_refused_where_it_cannot_read_features():
    with pytest.raises(TypeError, match="JudgeRule reads the target's features, but NoFeatures cannot return them"):
        decode(NoFeatures(), torch.tensor([0]), 4, SamplingConfig(), drafter=_jacobi(), rule=JudgeRule(_ones, 0.5),
               window=2)
    model = tiny_llamagen(**MODEL)
    with pytest.raises(ValueError, match="lossless rule only"):
        decode(model, _labels([0], PLAIN), 16, PLAIN, drafter=_jacobi(), rule=JudgeRule(_ones, 0.5), window=4,
               siblings=2)
    p, q, drafts = _step(0, 2, 2)
    with pytest.raises(ValueError, match="the decode handed none"):
        JudgeRule(_ones, 0.5)(drafts, q, p, _gen(0))
