"""The shipped text pair (assets/text-pair, trained by ``visualspec train-text``) loads, stays under
20 MB, and is really trained: on held-out standard-library code the draft model's drafts are
accepted often, and greedy speculative output equals the target's own ``generate``."""

import pytest

from visualspec.assets import TEXT_PAIR as PAIR
from visualspec.text import generate_text
from visualspec.tools.bench_text import held_out_prompts, load_pair


@pytest.fixture(scope="module")
def pair():
    return load_pair(PAIR)


def test_the_pair_stays_under_20_mb():
    size = sum(f.stat().st_size for f in PAIR.rglob("*") if f.is_file())
    assert size <= 20 * 2**20, f"{size / 2**20:.1f} MiB"


def test_drafts_are_accepted_on_held_out_code_and_greedy_output_is_exact(pair):
    """A random draft of a 4096-token vocabulary is almost never accepted (tau ~ 1); the trained
    pair accepts 2.3-2.6 tokens per step on such code (docs/benchmarks.md), and must stay above 1.8."""
    tokenizer, target, draft = pair
    for prompt in held_out_prompts(PAIR, tokenizer, 2, seed=3):
        out = generate_text(target, tokenizer, prompt, drafter=draft, window=6, max_new_tokens=48, temperature=0)
        ref = generate_text(target, tokenizer, prompt, max_new_tokens=48, temperature=0)
        assert out.token_ids == ref.token_ids
        assert out.stats.mean_accepted > 1.8, out.stats.summary()


def test_held_out_prompts_reach_any_count_and_keep_the_first_passes(pair):
    """22 held-out files are long enough for one 96-token prompt each; 40 prompts take a second cut
    from them, and the first pass's prompts stay the ones fewer prompts give."""
    tokenizer = pair[0]
    first, many = held_out_prompts(PAIR, tokenizer, 8), held_out_prompts(PAIR, tokenizer, 40)
    assert len(many) == 40 and len(set(many)) == 40 and many[:8] == first
