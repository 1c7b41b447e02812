"""Text's window="auto" with and without the pool of calls (docs/experiments/2026-12-07-window-guard.md).

    python benchmarks/text_window_pool.py variants --seed 17 --prompts 24 --first first
    python benchmarks/text_window_pool.py variants --seed 17 --prompts 24 --first copying
    python benchmarks/text_window_pool.py estimate --seed 17 --prompts 12
    python benchmarks/text_window_pool.py above --seed 37 --prompts 24 --first first
    python benchmarks/text_window_pool.py ties --seed 41 --prompts 24

``variants``: compiled AR and the compiled ``window="auto"`` rows of n-gram, STAND, the shipped
draft model and feature drafter, each with the pool off and on, interleaved prompt by prompt on
``--prompts`` held-out prompts of ``--seed``. Each row's first call times its table: on the first
prompt (``first``), or on the prompt among the next 40 whose greedy continuation a 2-gram lookup
predicts best (``copying``). Run each in a fresh ``VISUALSPEC_HOME`` so the tables are timed anew.
Prints tokens per second, the speed over AR, tau, and the score (geometric mean over the drafters).

``above``: the ``window="auto"`` rows of n-gram and STAND, eager and compiled, with windows above
every pooled call's estimated from the table alone (the old way) or scaled as the pool moved the
largest pooled window (the new), each with a pool of its own; the score is the geometric mean of
new / old (docs/experiments/2026-12-07-pool-above-the-calls.md).

``ties``: the same rows with the fixed window chosen as now or, among the windows whose tokens a
step equal the chosen one's exactly (which the table could not tell apart), the largest; the score
is the geometric mean of largest / now (docs/experiments/2026-12-07-equal-yield-windows.md).

``estimate``: each drafter decodes at fixed windows 2, 4, 8 and 32; the window-32 decodes' row-steps
estimate the smaller windows' tokens a step by ``min(c, w)`` and by ``c`` over ``ceil(c / w)`` steps
(:func:`visualspec.core.window.split_steps`), beside the real decodes.
"""

import argparse
import json
import math
import time

import torch

import visualspec.text.generate as gen
from visualspec.core import window, window_costs
from visualspec.core.window import pooled_tokens, split_steps
from visualspec.text import generate_text
from visualspec.tools.bench_text import PROMPT_TOKENS, held_out_prompts, load_feature_drafter, load_pair, pair_folder

NEW_TOKENS = 128


def copying_share(prompt_ids: list[int], continuation: list[int]) -> float:
    """The share of ``continuation`` a 2-gram lookup over the text before each token predicts."""
    ids, hits = list(prompt_ids), 0
    for token in continuation:
        key, guess = tuple(ids[-2:]), None
        for j in range(len(ids) - 3, -1, -1):
            if tuple(ids[j:j + 2]) == key:
                guess = ids[j + 2]
                break
        hits += guess == token
        ids.append(token)
    return hits / len(continuation)


def variants(args, tokenizer, target, drafters, call):
    texts = held_out_prompts(pair_folder(), tokenizer, args.prompts, PROMPT_TOKENS, seed=args.seed)
    first = first_prompt(args, tokenizer, texts, call)
    pooled = {"on": True}
    step_policy = window_costs.step_policy

    def toggled(*a, **kw):  # the pool as generate_text asks for it, or off
        return step_policy(*a, **{**kw, "pooled": kw.get("pooled", False) and pooled["on"]})

    gen.step_policy = toggled
    rows = [("ar", None)] + [(name, v) for name in drafters for v in ("off", "on")]
    seconds, tokens, forwards = dict.fromkeys(rows, 0.0), dict.fromkeys(rows, 0), dict.fromkeys(rows, 0)
    for i, prompt in enumerate([first, *texts]):
        for row in rows:
            pooled["on"] = row[1] == "on"
            t0 = time.perf_counter()
            out = call(prompt, drafter=drafters.get(row[0]))
            if i:  # the first round is the warm-up that times the tables
                seconds[row] += time.perf_counter() - t0
                tokens[row] += len(out.token_ids[0])
                forwards[row] += out.stats.target_forwards
    speed = {row: tokens[row] / seconds[row] for row in rows}
    result = {f"{name}|{v}": {"tokens_per_s": round(speed[name, v], 1), "vs_ar": round(speed[name, v] / speed[rows[0]], 3),
                              "tau": round(tokens[name, v] / forwards[name, v], 2)} for name, v in rows}
    for v in ("off", "on"):
        logs = [math.log(speed[name, v] / speed[rows[0]]) for name in drafters]
        result[f"score|{v}"] = round(math.exp(sum(logs) / len(logs)), 4)
    return result


def table_only_above(tokens, pool, new_tokens):
    """The pool's estimate before 2026-12-07's change: windows above every pooled one keep the table's."""
    top = max([w for w in tokens if w > 1 and pool.get(w, (0.0, 0))[1] > 0], default=max(tokens))
    pooled = pooled_tokens(tokens, pool, new_tokens)  # the module's own: window_costs' name is swapped below
    return {w: tokens[w] if w > top else t for w, t in pooled.items()}


def two_variants(args, tokenizer, drafters, call, variants: tuple[str, str], variant: dict):
    """The ``window="auto"`` rows of n-gram and STAND, eager and compiled, under each of
    ``variants`` (the study sets ``variant["now"]`` to the one a call runs), each variant with a pool
    of its own, alternated prompt by prompt (order reversed every other prompt) after the first
    prompt's calls, which time the tables. Speed and tau per row and variant; the score is the
    geometric mean of the second variant's speed over the first's, and the lowest ratio."""
    texts = held_out_prompts(pair_folder(), tokenizer, args.prompts, PROMPT_TOKENS, seed=args.seed)
    first = first_prompt(args, tokenizer, texts, call)
    make_pool = window_costs.CallPool
    window_costs.CallPool = lambda key, windows: make_pool(f"{key}|{variant['now']}", windows)
    rows = [(name, compiled, v) for name in ("ngram", "stand") for compiled in (False, True) for v in variants]
    seconds, tokens, steps = dict.fromkeys(rows, 0.0), dict.fromkeys(rows, 0), dict.fromkeys(rows, 0)
    for i, prompt in enumerate([first, *texts]):
        for row in (rows if i % 2 else rows[::-1]):
            name, compiled, variant["now"] = row
            t0 = time.perf_counter()
            out = call(prompt, drafter=drafters[name], compile=compiled)
            if i:  # the first round is the warm-up that times the tables
                seconds[row] += time.perf_counter() - t0
                tokens[row] += len(out.token_ids[0])
                steps[row] += len(out.stats.accepted_lengths)
    speed = {row: tokens[row] / seconds[row] for row in rows}
    result = {f"{name}|{'compiled' if compiled else 'eager'}": {
        **{v: round(speed[name, compiled, v], 1) for v in variants},
        **{f"tau {v}": round(tokens[name, compiled, v] / steps[name, compiled, v], 2) for v in variants}}
        for name, compiled, _ in rows}
    old, new = variants
    ratios = [speed[name, compiled, new] / speed[name, compiled, old] for name, compiled, v in rows if v == new]
    result["score"] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4)
    result["lowest"] = round(min(ratios), 4)
    return result


def above(args, tokenizer, target, drafters, call):
    """The windows above every pooled call's estimated the old way (the table's) or the new (scaled)
    (:func:`two_variants`; docs/experiments/2026-12-07-pool-above-the-calls.md)."""
    variant = {"now": "new"}
    estimates = {"old": table_only_above, "new": pooled_tokens}
    window_costs.pooled_tokens = lambda *a: estimates[variant["now"]](*a)
    return two_variants(args, tokenizer, drafters, call, ("old", "new"), variant)


FASTEST = window.best_fixed_window  # the choice as it stands (ties studies patch the module's name)


def largest_of_equal_yield(costs, tokens):
    """The variant of docs/experiments/2026-12-07-equal-yield-windows.md: the fastest window, then
    the largest whose tokens a step equal that window's exactly."""
    best = FASTEST(costs, tokens)
    return max(w for w in costs if w == best or (w > best and w in tokens and tokens[w] == tokens.get(best)))


def ties(args, tokenizer, target, drafters, call):
    """The fixed window chosen as now (``now``) or the largest of the windows of the chosen one's
    yield (``largest``) (:func:`two_variants`; docs/experiments/2026-12-07-equal-yield-windows.md)."""
    variant = {"now": "now"}
    choose = {"now": FASTEST, "largest": largest_of_equal_yield}
    window.best_fixed_window = window_costs.best_fixed_window = lambda *a: choose[variant["now"]](*a)
    return two_variants(args, tokenizer, drafters, call, ("now", "largest"), variant)


def first_prompt(args, tokenizer, texts, call):
    """The prompt whose call times the tables: the first (``--first first``), or among the 40 after
    ``texts`` the one whose greedy continuation a 2-gram lookup predicts best (``copying``)."""
    if args.first != "copying":
        return texts[0]
    candidates = held_out_prompts(pair_folder(), tokenizer, args.prompts + 40, PROMPT_TOKENS,
                                  seed=args.seed)[args.prompts:]
    shares = [copying_share(tokenizer(p).input_ids, call(p).token_ids[0]) for p in candidates]
    print(f"first call: candidate {shares.index(max(shares))}, copying share {max(shares):.2f}")
    return candidates[max(range(len(candidates)), key=shares.__getitem__)]


def estimate(args, tokenizer, target, drafters, call):
    texts = held_out_prompts(pair_folder(), tokenizer, args.prompts, PROMPT_TOKENS, seed=args.seed)
    result = {}
    for name, drafter in drafters.items():
        steps = {w: [c for p in texts for c in call(p, drafter=drafter, window=w).stats.accepted_lengths]
                 for w in (2, 4, 8, 32)}
        wide = steps[32]
        result[name] = {w: {"real": round(sum(steps[w]) / len(steps[w]), 3),
                            "min(c, w)": round(sum(min(c, w) for c in wide) / len(wide), 3),
                            "split": round(sum(wide) / split_steps(wide, w), 3)} for w in (2, 4, 8)}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=("variants", "estimate", "above", "ties"))
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--first", choices=("first", "copying"), default="first")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = pair_folder()
    tokenizer, target, draft = load_pair(folder)
    drafters = {"ngram": "ngram", "stand": "stand", "draft": draft, "feature": load_feature_drafter(folder)}

    def call(prompt, drafter=None, compile=True, **kw):
        return generate_text(target, tokenizer, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS, temperature=0,
                             generator=torch.Generator().manual_seed(0), compile=compile, **kw)

    study = {"variants": variants, "estimate": estimate, "above": above, "ties": ties}[args.study]
    print(json.dumps(study(args, tokenizer, target, drafters, call), indent=1))


if __name__ == "__main__":
    main()
