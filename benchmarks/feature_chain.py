"""The shipped text feature drafter's greedy proposals: one compiled chain against draft by draft.

    python benchmarks/feature_chain.py --window 8
    python benchmarks/feature_chain.py --window 16 --seed 17 --prompts 8 --rounds 2
    python benchmarks/feature_chain.py --window 8 --fr-spec      # FR-Spec: the head's 1,024 most frequent ids

Compiled, greedy, 128 new tokens, at a fixed window, on held-out prompts of ``--seed``: the same
calls with the chain (``FeatureDraftModel.greedy_chain``, as ``generate_text`` runs them) and with
it turned off, alternated prompt by prompt, after a warm-up call each (the first chain call's
seconds, compiles included, are printed). Tokens per second, tau, and outputs equal to compiled AR's.
``--fr-spec``: both draft from the quarter of the vocabulary ``bench-text``'s FR-Spec rows keep.
"""

import sys
import time
from pathlib import Path


from visualspec.drafters import FeatureDrafter
from visualspec.text import generate_text
from visualspec.tools.bench_text import calibration_vocab, load_feature_drafter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import text_study_pair, text_study_parser  # noqa: E402

NEW_TOKENS = 128


def main():
    parser = text_study_parser(__doc__, seed=17, prompts=8)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--fr-spec", action="store_true", help="draft from the kept quarter of the vocabulary")
    args = parser.parse_args()
    folder, tokenizer, target, texts = text_study_pair(args)
    feature = load_feature_drafter(folder)
    chain_modules = FeatureDrafter.chain_modules
    kept = calibration_vocab(folder, tokenizer, len(tokenizer) // 4) if args.fr_spec else None

    def call(prompt, chain, drafter=feature):
        FeatureDrafter.chain_modules = chain_modules if chain else (lambda self, k, sampling=None: None)
        return generate_text(target, tokenizer, prompt, drafter=drafter, window=args.window,
                             max_new_tokens=NEW_TOKENS, temperature=0, compile=True,
                             draft_vocab=kept if drafter is not None else None)

    t0 = time.perf_counter()
    call(texts[0], True)
    print(f"first chain call (compiles included): {time.perf_counter() - t0:.1f} s")
    call(texts[0], False)
    reference = [call(p, False, drafter=None).token_ids[0] for p in texts]
    seconds, forwards, equal = {True: 0.0, False: 0.0}, {True: 0, False: 0}, {True: 0, False: 0}
    for _ in range(args.rounds):
        for prompt, ref in zip(texts, reference):
            for chain in (True, False):
                t0 = time.perf_counter()
                out = call(prompt, chain)
                seconds[chain] += time.perf_counter() - t0
                forwards[chain] += out.stats.target_forwards
                equal[chain] += out.token_ids[0] == ref
    tokens = args.rounds * len(texts) * NEW_TOKENS
    for chain in (True, False):
        print(f"{'chain' if chain else 'draft by draft'}: {tokens / seconds[chain]:.1f} tokens/s, "
              f"tau {tokens / forwards[chain]:.2f}, equal to AR {equal[chain]}/{args.rounds * len(texts)}")


if __name__ == "__main__":
    main()
