"""Text benchmark on the trained pair: visualspec's drafters and verifiers against transformers'
own ``generate``, assisted generation and prompt lookup, side by side in one run.

Every method decodes the same prompts greedily (so outputs can be compared token for token), after
one warm-up call each, interleaved prompt by prompt. For each method: tokens per second, the
speedup over plain ``generate`` measured in the same run, and Spec-Bench's tau (mean tokens per
target forward, counting the bonus token); target forwards are counted with a forward hook, so
transformers' methods are measured the same way as ours.

:func:`multidraft_gap` compares the multi-draft verifiers with the optimal acceptance rate at real
positions of the pair: the target's and the draft's distributions (temperature 1) are reduced to
their ``top`` most likely tokens plus one "other" token, and on that small vocabulary each rule's
exact acceptance rate and the optimum (:func:`visualspec.core.multidraft.optimal_acceptance`) are
computed by enumeration.
"""

from __future__ import annotations

import copy
import platform
import time
from pathlib import Path

import numpy as np
import torch

from ..models.quantized import check_quantize, quantize_model
from ..text import generate_text

PROMPT_TOKENS = 96


PAIR_PARTS = ("tokenizer", "target", "draft")


def pair_folder(folder=None) -> Path:
    """The folder of a text pair (``train-text``'s output: ``tokenizer/``, ``target/``, ``draft/``).

    ``None`` is the shipped pair; ``"text-pair"`` or ``"assets/text-pair"`` where no such folder
    exists here is too, from any working folder (:func:`~visualspec.tools.loading.shipped_folder`);
    anything else is a path, and a missing one, or one without the three parts, is a
    FileNotFoundError that names it."""
    from ..assets import TEXT_PAIR
    from .loading import shipped_folder

    if folder is None:
        return TEXT_PAIR
    path = shipped_folder(folder) or Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"no text pair folder {str(path)!r}" + (" (it is a file)" if path.exists() else "")
                                + "; the shipped pair is 'text-pair' (visualspec.assets.TEXT_PAIR)")
    missing = [part for part in PAIR_PARTS if not (path / part).is_dir()]
    if missing:
        raise FileNotFoundError(f"{str(path)!r} is not a text pair folder: it has no {', '.join(missing)} "
                                f"folder (train-text writes tokenizer/, target/ and draft/)")
    return path


def load_pair(folder=None):
    """(tokenizer, target, draft) of a text pair folder (:func:`pair_folder`; default: the shipped one)."""
    from transformers import PreTrainedTokenizerFast

    from .loading import quiet_loaders

    folder = pair_folder(folder)
    quiet_loaders()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder / "tokenizer")
    return tokenizer, _causal_lm(folder / "target"), _causal_lm(folder / "draft")


def _causal_lm(path: Path):
    """A pair's transformers model folder, in float32, for inference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True).eval()


FEATURE_DRAFTER = "feature-drafter"  # the pair's optional EAGLE-style drafter folder (train-drafter's output)
DISTILLED_DRAFT = "draft-distilled"  # the pair's optional DistillSpec draft (train-drafter --kind distill)
KANGAROO = "kangaroo"  # the pair's optional Kangaroo adapter (train-drafter --kind kangaroo)
CHIMERA = "chimera"  # the pair's optional Chimera drafter (train-drafter --kind chimera)


def load_distilled_draft(folder=None):
    """The pair's distilled draft model (``draft-distilled/``, in float32), or None where it has none."""
    path = pair_folder(folder) / DISTILLED_DRAFT
    return _causal_lm(path) if (path / "config.json").is_file() else None


def load_feature_drafter(folder=None, name: str = FEATURE_DRAFTER):
    """The pair's feature drafter (``feature-drafter/``; ``name=CHIMERA``: its Chimera drafter,
    ``chimera/``), in float32, or None where it has none."""
    from ..models.feature_drafter import load_draft_model

    path = pair_folder(folder) / name
    if not (path / "config.json").is_file():
        return None
    return load_draft_model(path, torch_dtype=torch.float32).eval()


def load_kangaroo_drafter(folder, target):
    """The pair's Kangaroo draft model around ``target`` (``kangaroo/``), or None where it has none."""
    from ..models.kangaroo import is_kangaroo_folder, load_kangaroo

    path = pair_folder(folder) / KANGAROO
    return load_kangaroo(path, target) if is_kangaroo_folder(path) else None


def held_out_prompts(folder, tokenizer, count: int, tokens: int = PROMPT_TOKENS, seed: int = 0) -> list[str]:
    """``count`` prompts of ``tokens`` tokens cut from the pair's held-out standard-library files:
    one from each file long enough (at least 4 prompts' worth), in a random order of the files;
    when that gives fewer than ``count``, another pass cuts one more from each, and so on (a file
    gives at most one prompt per pass, so the first pass's prompts stay what they were)."""
    from ..eval.code import held_out_files, read_source

    rng = np.random.default_rng(seed)
    prompts, long_files = [], []
    for name in rng.permutation(held_out_files(folder)):
        ids = tokenizer(read_source(name)).input_ids
        if len(ids) < 4 * tokens:
            continue
        long_files.append(ids)
        start = int(rng.integers(0, len(ids) - 2 * tokens))
        prompts.append(tokenizer.decode(ids[start:start + tokens]))
        if len(prompts) == count:
            return prompts
    if not prompts:
        raise ValueError(f"no held-out file of {folder} is long enough for {tokens}-token prompts")
    while len(prompts) < count:  # later passes over the same files, at new random places
        for ids in long_files:
            start = int(rng.integers(0, len(ids) - 2 * tokens))
            prompts.append(tokenizer.decode(ids[start:start + tokens]))
            if len(prompts) == count:
                break
    return prompts


def calibration_vocab(folder, tokenizer, size: int, files: int = 50) -> torch.Tensor:
    """VocabTrim's kept set: the ``size`` most frequent tokens of ``files`` training files (the
    target was trained on them, so their statistics stand in for target-generated text)."""
    from ..drafters import frequent_tokens
    from ..eval.code import STDLIB, held_out_files

    held = set(held_out_files(folder))
    names = [p for p in sorted(STDLIB.glob("*.py")) if str(p.relative_to(STDLIB)) not in held][:files]
    ids = [tokenizer(p.read_text(encoding="utf-8", errors="replace")).input_ids for p in names]
    return frequent_tokens(ids, size, always=[tokenizer.eos_token_id])


class ForwardCounter:
    """Counts forward calls of a module (one per target forward pass), compiled ones too: the count
    is a tensor the hook adds to, which a compiled graph does as well (a Python int would be a
    constant of the graph, and each new value a recompile)."""

    def __init__(self, *modules):
        self._count = torch.zeros((), dtype=torch.long)
        self.handles = [module.register_forward_hook(self._hook) for module in modules]

    def _hook(self, *_) -> None:  # returns nothing: a forward hook's return value replaces the output
        self._count.add_(1)

    @property
    def calls(self) -> int:
        return int(self._count)

    @calls.setter
    def calls(self, value: int) -> None:
        self._count.fill_(value)


def _hf_generate(model, tokenizer, prompt, new_tokens, temperature: float = 0.0, **kwargs):
    enc = tokenizer([prompt], return_tensors="pt")
    if temperature > 0:  # plain sampling at that temperature, as visualspec's rows sample (no top-k, no top-p)
        torch.manual_seed(0)
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False)
    out = model.generate(**enc, max_new_tokens=new_tokens, pad_token_id=tokenizer.eos_token_id, **kwargs)
    return out[0, enc.input_ids.shape[1]:].tolist()


def _static_compiled():
    """transformers' own fastest AR here: a static cache and its compiled one-token step (``generate``
    compiles on a CPU only when told it may)."""
    from transformers import CompileConfig

    config = CompileConfig(mode="default")
    config._compile_all_devices = True
    return dict(cache_implementation="static", compile_config=config)


AR_METHODS = ("generate", "transformers generate, static compiled", "visualspec AR", "visualspec AR, compiled")
COMPILE_CHOICES = ("off", "on", "both")


COMPILED_DRAFT = dict(window=6, draft_stop_below=0.6)  # chosen on seed=1 prompts (docs/experiments/2026-11-27-compiled-transformers-step.md)
FEATURE_TREE = (3, 2)  # the dynamic tree's depth and width (docs/experiments/2026-11-28-dynamic-tree-text.md)
# the feature drafter's + lookup rows' shortest copied match (docs/experiments/2026-12-07-lookup-feature-drafter.md)
LOOKUP = 3


def is_ar(name: str) -> bool:
    """Whether bench-text row ``name`` decodes autoregressively (quantised AR rows too)."""
    return name in AR_METHODS or name.startswith("visualspec AR, ")


def methods(target, draft, tokenizer, window: int = 6, kept=None, draft_window: int = 10, stop_below: float = 0.2,
            compile: str = "both", quantized=None, feature=None, feature_window: int = 4, distilled=None,
            temperature: float = 0.0, kangaroo=None, kangaroo_window: int = 4, chimera=None,
            feature_tree: tuple[int, int] = FEATURE_TREE, judge=None, judge_thresholds=(None,),
            lookup_window: int = 8):
    """name -> function(prompt, new_tokens) -> new token ids; ``kept``: VocabTrim's kept ids.

    ``window``: tokens per target forward of the model-free drafters and of the fixed-length draft
    model row (the rows named ``auto window``, eager and compiled, choose it each call instead, as
    ``generate_text``'s default ``window="auto"`` does); the main draft model rows draft up to ``draft_window - 1`` tokens and stop early
    below ``stop_below`` (as transformers' assisted generation stops below its confidence threshold).
    ``compile``: ``"off"``, the eager rows; ``"on"``, the compiled rows (visualspec's on a static
    cache, :func:`visualspec.text.generate_text` with ``compile=True``, and transformers' static
    compiled ``generate``), beside plain ``generate``; ``"both"``. The compiled draft model row
    drafts as :data:`COMPILED_DRAFT` says: a cheaper target step makes each draft forward dearer.
    ``quantized``: a ``(scheme, model)`` pair, the target with quantised weights, adds its AR and
    STAND rows (eager and compiled, as ``compile`` says), named ``..., SCHEME``.
    ``feature``: the pair's feature drafter (:func:`load_feature_drafter`), whose rows draft
    ``feature_window - 1`` tokens a step (its ``FR-Spec 1/4`` rows draft from the head's ``kept``
    rows only, the VocabTrim row's set; its ``dynamic tree`` rows grow trees of ``feature_tree``
    = (depth, width) instead of chains; its ``+ lookup`` rows copy drafts where the context repeats,
    ``generate_text(..., lookup=LOOKUP)``, at ``lookup_window`` or the auto window); ``distilled``: the pair's distilled draft model
    (``draft-distilled/``, DistillSpec), drafting as the draft model rows do. ``kangaroo``: the
    pair's Kangaroo draft model (:func:`load_kangaroo_drafter`), drafting up to ``kangaroo_window - 1``
    tokens a step and stopping below its folder's threshold. ``chimera``: the pair's Chimera drafter
    (``load_feature_drafter(folder, CHIMERA)``), drafting one token per head a step. ``temperature`` > 0
    samples every row at that temperature (transformers' rows too; no top-k or top-p).
    ``judge``: a judge for the target (:class:`~visualspec.models.judge.JudgeHead`, ``train-judge
    --pair``): the draft model rows again under judge decoding (``acceptance="judge"``, the same
    drafts), once per threshold of ``judge_thresholds`` (None: the judge's own), eager and compiled as
    ``compile`` says, named ``..., judge`` or ``..., judge@T``.
    """
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {COMPILE_CHOICES}, got {compile!r}")

    def ours(compile=False, model=target, **kw):  # eager unless the row says compiled ("auto" follows stored costs)
        return lambda prompt, n: generate_text(model, tokenizer, prompt, max_new_tokens=n, temperature=temperature,
                                               generator=torch.Generator().manual_seed(0), compile=compile,
                                               **kw).token_ids[0]

    def hf(**kw):
        return lambda p, n: _hf_generate(target, tokenizer, p, n, temperature, **kw)
    dynamic = dict(drafter=draft, window=draft_window, draft_stop_below=stop_below)
    eager = {
        "transformers assisted (draft model)": hf(assistant_model=draft),
        "transformers prompt lookup": hf(prompt_lookup_num_tokens=10),
        "visualspec AR": ours(),
        "visualspec draft model": ours(**dynamic),
        f"visualspec draft model, fixed window {window}": ours(drafter=draft, window=window),
        "visualspec draft model, VocabTrim 1/4": ours(**dynamic,
                                                      draft_vocab=kept if kept is not None else len(tokenizer) // 4),
        "visualspec draft tree 2x3 (rsd)": ours(drafter=draft, window=7, branches=2),
        "visualspec n-gram": ours(drafter="ngram", window=window),
        "visualspec STAND": ours(drafter="stand", window=window),
        # generate_text's defaults with compile=False: each call at its table's window, pooled over calls
        "visualspec n-gram, auto window": ours(drafter="ngram", window="auto"),
        "visualspec STAND, auto window": ours(drafter="stand", window="auto"),
        "visualspec Jacobi": ours(drafter="jacobi", window=window),
    }
    compiled = {
        "transformers generate, static compiled": hf(**_static_compiled()),
        "visualspec AR, compiled": ours(compile=True),
        "visualspec draft model, compiled": ours(drafter=draft, **COMPILED_DRAFT, compile=True),
        "visualspec n-gram, compiled": ours(drafter="ngram", window=window, compile=True),
        "visualspec STAND, compiled": ours(drafter="stand", window=window, compile=True),
        # window="auto": each step's window from this machine's measured step costs, drafts priced
        "visualspec draft model, compiled, auto window": ours(drafter=draft, compile=True),
        "visualspec n-gram, compiled, auto window": ours(drafter="ngram", compile=True),
        "visualspec STAND, compiled, auto window": ours(drafter="stand", compile=True),
    }
    if feature is not None:
        eager["visualspec feature drafter"] = ours(drafter=feature, window=feature_window)
        compiled["visualspec feature drafter, compiled"] = ours(drafter=feature, window=feature_window, compile=True)
        compiled["visualspec feature drafter, compiled, auto window"] = ours(drafter=feature, compile=True)
        trim = dict(drafter=feature, draft_vocab=kept if kept is not None else len(tokenizer) // 4, compile=True)
        compiled["visualspec feature drafter, FR-Spec 1/4, compiled"] = ours(**trim, window=feature_window)
        compiled["visualspec feature drafter, FR-Spec 1/4, compiled, auto window"] = ours(**trim)
        copying = f"visualspec feature drafter + lookup {LOOKUP}"
        eager[copying] = ours(drafter=feature, lookup=LOOKUP, window=lookup_window)
        compiled[copying + ", compiled"] = ours(drafter=feature, lookup=LOOKUP, window=lookup_window, compile=True)
        compiled[copying + ", compiled, auto window"] = ours(drafter=feature, lookup=LOOKUP, compile=True)
        depth, width = feature_tree
        tree = f"visualspec feature drafter, dynamic tree {depth}x{width}"
        eager[tree] = ours(drafter=feature, depth=depth, tree_width=width)
        compiled[tree + ", compiled"] = ours(drafter=feature, depth=depth, tree_width=width, compile=True)
    if chimera is not None:
        chimera_window = chimera.config.heads + 1
        eager["visualspec Chimera"] = ours(drafter=chimera, window=chimera_window)
        compiled["visualspec Chimera, compiled"] = ours(drafter=chimera, window=chimera_window, compile=True)
        compiled["visualspec Chimera, compiled, auto window"] = ours(drafter=chimera, compile=True)
    if kangaroo is not None:
        eager["visualspec Kangaroo"] = ours(drafter=kangaroo, window=kangaroo_window)
        compiled["visualspec Kangaroo, compiled"] = ours(drafter=kangaroo, window=kangaroo_window, compile=True)
        compiled["visualspec Kangaroo, compiled, auto window"] = ours(drafter=kangaroo, compile=True)
    for threshold in judge_thresholds if judge is not None else ():
        kw = dict(acceptance="judge", judge=judge, judge_threshold=threshold)
        name = "judge" if threshold is None else f"judge@{threshold:g}"
        eager[f"visualspec draft model, {name}"] = ours(**dynamic, **kw)
        eager[f"visualspec draft model, fixed window {window}, {name}"] = ours(drafter=draft, window=window, **kw)
        compiled[f"visualspec draft model, compiled, {name}"] = ours(drafter=draft, **COMPILED_DRAFT, compile=True,
                                                                     **kw)
    if distilled is not None:
        eager["visualspec distilled draft model"] = ours(**{**dynamic, "drafter": distilled})
        compiled["visualspec distilled draft model, compiled"] = ours(drafter=distilled, **COMPILED_DRAFT, compile=True)
    table = {"generate": hf()}
    table.update(eager if compile != "on" else {})
    table.update(compiled if compile != "off" else {})
    if quantized is not None:
        scheme, model = quantized
        for compiled in (False, True):
            if compile != ("off" if compiled else "on"):
                c = ", compiled" if compiled else ""
                table[f"visualspec AR{c}, {scheme}"] = ours(compile=compiled, model=model)
                table[f"visualspec STAND{c}, {scheme}"] = ours(drafter="stand", window=window, compile=compiled,
                                                               model=model)
    return table


@torch.no_grad()
def run_text_benchmark(folder, prompts: int = 8, new_tokens: int = 128, window: int = 6, threads: int | None = None,
                       only: list[str] | None = None, prompt_tokens: int = PROMPT_TOKENS, draft_window: int = 10,
                       stop_below: float = 0.2, compile: str = "both", quantize: str | None = None,
                       progress: bool = False, feature_window: int = 4, seed: int = 0,
                       temperature: float = 0.0, kangaroo_window: int = 4,
                       feature_tree: tuple[int, int] = FEATURE_TREE, judge=None, judge_thresholds=(None,),
                       lookup_window: int = 8) -> dict:
    """Every method on the same prompts, interleaved; speed-ups over ``generate`` and over the
    fastest autoregressive row of the run (``best_ar``: eager or compiled, ours or transformers',
    quantised with ``quantize`` where those rows are asked for and win).
    Each method's first call (a full-length warm-up: window costs, compiled graphs) is timed
    apart, as ``first_call_seconds``. ``progress``: a bar on stderr advancing once per generation.
    ``temperature`` > 0 samples (each call seeded alike); outputs then differ from ``generate``'s by
    design, and ``greedy_output_equal`` says so.

    ``judge`` (a judge folder for the target, ``train-judge --pair``) adds the judge decoding rows
    (:func:`methods`) and draws the prompts from the held-out files the judge did not see, cut at
    line starts (:func:`visualspec.eval.code.held_out_code`, ``REPORT_FILES``); every row then also
    reports ``valid`` (the share of its continuations that are valid Python in their files),
    ``statements_right`` (:func:`visualspec.eval.code.kept_outcome` against each file's own next
    lines: the judge's outcome measure) and ``statements_kept`` (against ``generate``'s output)."""
    from tqdm.auto import tqdm

    if threads:
        torch.set_num_threads(threads)
    folder = pair_folder(folder)
    tokenizer, target, draft = load_pair(folder)
    code = None
    if judge is not None:
        from ..eval.code import REPORT_FILES, held_out_code
        from ..models.judge import JudgeHead

        judge = JudgeHead.from_pretrained(judge)
        code = held_out_code(folder, tokenizer, prompts, prompt_tokens, seed=seed, files=REPORT_FILES)
        texts = [p.prompt for p in code]
    else:
        texts = held_out_prompts(folder, tokenizer, prompts, prompt_tokens, seed=seed)
    check_quantize(quantize)
    quantized = None
    if quantize is not None:
        quantized = (quantize, copy.deepcopy(target))
        quantize_model(quantized[1], quantize)
    table = methods(target, draft, tokenizer, window, calibration_vocab(folder, tokenizer, len(tokenizer) // 4),
                    draft_window, stop_below, compile, quantized, load_feature_drafter(folder), feature_window,
                    load_distilled_draft(folder), temperature, load_kangaroo_drafter(folder, target), kangaroo_window,
                    load_feature_drafter(folder, CHIMERA), tuple(feature_tree), judge, tuple(judge_thresholds),
                    lookup_window)
    if only:
        table = {k: v for k, v in table.items() if k == "generate" or k in only}
    # the base model: every target forward runs it, whether through the LM class or (to return
    # features, for the feature drafter) around it
    counter = ForwardCounter(target.base_model, *([quantized[1].base_model] if quantized else []))
    rows = {name: {"seconds": 0.0, "tokens": 0, "forwards": 0, "equal": 0} for name in table}
    outputs, first_call = {}, {}
    bar = tqdm(total=len(table) * (1 + len(texts)), desc="bench-text (first calls, then prompts)",
               disable=not progress)
    for name, fn in table.items():  # warm-up at full length: static caches and compiled graphs are sized by it
        t0 = time.perf_counter()
        fn(texts[0], new_tokens)
        first_call[name] = round(time.perf_counter() - t0, 2)
        bar.update()
    for i, prompt in enumerate(texts):
        for name, fn in table.items():
            counter.calls = 0
            t0 = time.perf_counter()
            ids = fn(prompt, new_tokens)
            rows[name]["seconds"] += time.perf_counter() - t0
            rows[name]["tokens"] += len(ids)
            rows[name]["forwards"] += counter.calls
            outputs[name, i] = ids
            bar.update()
    bar.close()
    results = {}
    speed = {name: r["tokens"] / r["seconds"] for name, r in rows.items()}
    best_ar = max((name for name in rows if is_ar(name)), key=speed.get)
    if code is not None:  # the outcome checks of --judge's code prompts, against generate's continuations
        from ..eval.code import is_valid, kept_outcome

        ref = [tokenizer.decode(outputs["generate", i], skip_special_tokens=True) for i in range(len(texts))]
    for name, r in rows.items():
        equal = sum(outputs[name, i] == outputs["generate", i] for i in range(len(texts)))
        results[name] = {"tokens_per_second": round(speed[name], 1),
                         "speedup_vs_generate": round(speed[name] / speed["generate"], 3),
                         "speedup_vs_best_ar": round(speed[name] / speed[best_ar], 3),
                         "tau": round(r["tokens"] / max(r["forwards"], 1), 3),
                         "target_forwards": r["forwards"],
                         "greedy_output_equal": f"{equal}/{len(texts)}" if temperature == 0 else "n/a (sampled)",
                         "first_call_seconds": first_call[name]}
        if code is not None:
            out = [tokenizer.decode(outputs[name, i], skip_special_tokens=True) for i in range(len(texts))]
            results[name]["valid"] = round(float(np.mean([is_valid(p.context, o) for p, o in zip(code, out)])), 4)
            results[name]["statements_kept"] = round(float(np.mean([kept_outcome(p.context, o, e) for p, o, e
                                                                    in zip(code, out, ref)])), 4)
            results[name]["statements_right"] = round(float(np.mean([kept_outcome(p.context, o, p.truth)
                                                                     for p, o in zip(code, out)])), 4)
    assisted = results.get("transformers assisted (draft model)")

    def ratio(name):
        ours = results.get(name)
        return round(ours["speedup_vs_generate"] / assisted["speedup_vs_generate"], 3) if ours and assisted else None
    return {
        "prompts": len(texts), "seed": seed, "temperature": temperature, "new_tokens": new_tokens, "window": window,
        "draft_window": draft_window,
        "feature_window": feature_window, "feature_tree": list(feature_tree), "lookup": LOOKUP,
        "lookup_window": lookup_window, "kangaroo_window": kangaroo_window,
        "draft_stop_below": stop_below, "compile": compile, "quantize": quantize, "best_ar": best_ar,
        "prompt_files": "all" if code is None else "report (line starts)", "results": results,
        "draft_model_speedup_ratio_to_assisted": ratio("visualspec draft model"),
        "compiled_draft_model_speedup_ratio_to_assisted": ratio("visualspec draft model, compiled"),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
    }


def _reduced(p: torch.Tensor, q: torch.Tensor, top: int):
    """p and q (V,) restricted to the ``top`` tokens most likely under p + q, plus one 'other' token."""
    keep = (p + q).topk(top).indices
    rest = torch.ones_like(p, dtype=torch.bool)
    rest[keep] = False
    return (torch.cat([p[keep], p[rest].sum()[None]]).double(), torch.cat([q[keep], q[rest].sum()[None]]).double())


@torch.no_grad()
def multidraft_gap(folder, positions: int = 16, k: int = 2, top: int = 7, seed: int = 0,
                   prompt_tokens: int = PROMPT_TOKENS) -> dict:
    """Exact acceptance of each multi-draft rule vs the optimum, at ``positions`` real positions."""
    from ..core.multidraft import acceptance_rate, optimal_acceptance

    folder = pair_folder(folder)
    tokenizer, target, draft = load_pair(folder)
    prompts = held_out_prompts(folder, tokenizer, positions, prompt_tokens, seed=seed)
    rates = {"rsd (without replacement)": [], "spectr (iid)": [], "recursive_iid (iid)": [],
             "optimal, without replacement": [], "optimal, iid": []}
    for prompt in prompts:
        ids = tokenizer([prompt], return_tensors="pt").input_ids
        p = target(ids).logits[0, -1].float().softmax(-1)
        q = draft(ids).logits[0, -1].float().softmax(-1)
        p, q = _reduced(p, q, top)
        rates["rsd (without replacement)"].append(acceptance_rate("rsd", p, q, k))
        rates["spectr (iid)"].append(acceptance_rate("spectr", p, q, k))
        rates["recursive_iid (iid)"].append(acceptance_rate("recursive_iid", p, q, k))
        rates["optimal, without replacement"].append(optimal_acceptance(p, q, k, "without_replacement"))
        rates["optimal, iid"].append(optimal_acceptance(p, q, k, "iid"))
    return {"k": k, "positions": len(prompts), "vocabulary": f"top {top} + other",
            "mean_acceptance": {name: round(float(np.mean(v)), 4) for name, v in rates.items()}}
