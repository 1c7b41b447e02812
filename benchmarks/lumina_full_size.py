"""AR and SJD at batch 1 on a full-size Lumina-mGPT-shaped model with random weights.

    python benchmarks/lumina_full_size.py --device cuda [--size 768] [--sjd-windows auto 16] [--json out.json]
    python benchmarks/lumina_full_size.py --device cuda --size 256 --compile both --sjd-windows --windows 1 16
    python benchmarks/lumina_full_size.py --device cuda --size 256 --compile on --sjd-windows --windows 1 \
        --quantize int4-weight
    python benchmarks/lumina_full_size.py --tiny            # the same path on a 2-layer model, any machine

No Lumina-mGPT checkpoint can be downloaded here, so this times the real architecture and the real
decode path on random weights: transformers' ``ChameleonForConditionalGeneration`` with the 7B
config (4096 wide, 32 layers, 32 heads, 11008 MLP, 65,536 tokens, qk-norm), in bfloat16, read
through :class:`visualspec.models.unified_ar.UnifiedImageLM` and decoded by the one engine, in
Lumina-mGPT 1's layout: a ``size/16`` square grid of the 8,192 Chameleon codes (token ids 4 to
8195, as in Chameleon's vocabulary), each row closed by a forced row end, the image by ``<eoss>``.
The prompt is ``--prompt-tokens`` random text tokens (Lumina's template and a prompt are about
that long), then the separator and the opening; guidance 4.0 against the opening alone and
top-k 2000, Lumina-mGPT 1's defaults. The image tokenizer's decode is not timed.

What random weights do and do not tell: the cost of each forward (one token, or a window of W)
is the real model's, so ``ms / forward`` and the window-cost table hold for the trained model too;
how many drafts are accepted is not (random weights accept almost none), so SJD's speed-up here
is not a trained model's. The window-cost table with a trained model's tokens per forward gives its speed-up.
A whole image's cache is filled once, untimed, before the timed runs: the cache grows by
concatenation, so the first decode to reach a length may pay the GPU allocator for it (the likely
cause, not established, of AR's slow steps when it ran first without this on 2026-11-26).

``--compile on`` (or ``both``: eager first, then compiled, in one run) runs the compiled static
step (:meth:`~visualspec.models.hf.HFCausalLM.compile_step`; on a GPU its ``"auto"`` mode captures
CUDA graphs), after compiling the bare forward of every window of ``--windows`` (for the cost table) and
every step graph its decodes take (the rule and the constraints inside; both times are printed, not
counted). Each
step kind's one-token forward is set beside the bandwidth limit: the decoder's weight bytes over
the device's measured copy bandwidth (a 1 GiB copy reads and writes 2 GiB), the least time a
forward that reads every weight once can take.

``--quantize`` quantises the decoder's linear layers (its transformer layers and its output head;
not the token embedding, of which a step reads a few rows) through :func:`visualspec.models.quantized.quantize_model`;
the bandwidth limit is then the quantised weights' stored bytes (packed codes and scales) over the
copy bandwidth.

It prints the machine, the window-cost table (ms per forward of W tokens at the middle of the
image, median of 5), then per mode (the median of ``--rounds`` rounds, the modes in turn): target
forwards, tokens per forward, seconds per image, milliseconds per forward and the weight bandwidth
of a forward (parameter bytes / time).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms, synchronized  # noqa: E402
from visualspec.core.engine import decode, precompile_decode  # noqa: E402
from visualspec.core.sampling import SamplingConfig  # noqa: E402
from visualspec.core.window import WindowPolicy, prefix_rows  # noqa: E402
from visualspec.core.window_costs import machine_name, measure_window_costs, synchronize  # noqa: E402
from visualspec.drafters import JacobiDrafter  # noqa: E402
from visualspec.models.quantized import QUANTIZE_SCHEMES, quantize_model, tensor_bytes  # noqa: E402
from visualspec.models.unified_ar import UnifiedImageLM, chameleon_layout  # noqa: E402

CODES = 8192  # Chameleon's VQGAN codebook; code c is token 4 + c
FULL = dict(vocab_size=65536, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
TINY = dict(FULL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4)
WINDOWS = (1, 2, 4, 8, 16, 32)


def code_name(c: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(c)) + "Z"


def vocabulary_map() -> dict:
    """Chameleon's image code names at ids 4..8195 and the layout tokens Lumina-mGPT 1 uses (its
    size tokens up to 64 cells)."""
    vocab = {code_name(c): 4 + c for c in range(CODES)}
    names = ["<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"]
    names += [f"<reserved{8800 + n:05d}>" for n in range(1, 65)]
    vocab.update({name: 4 + CODES + i for i, name in enumerate(names)})
    return vocab


def build_model(dims: dict, device, dtype):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    config = ChameleonConfig(**dims, vocabulary_map=vocabulary_map(), pad_token_id=1, bos_token_id=0,
                             eos_token_id=2)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = ChameleonForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def model_prefix(layout, vocab: dict, prompt_tokens: int, device, guided: bool):
    """One prompt of random text ids, the separator and the opening; under guidance, the opening
    alone as the unconditional row, left-padded."""
    g = torch.Generator().manual_seed(1)
    text = (4 + CODES + 100 + torch.randint(0, 50000, (prompt_tokens,), generator=g)).tolist()
    cond = [0] + text + [vocab["<reserved08706>"]] + list(layout.opening)
    rows = [cond] + ([list(layout.opening)] if guided else [])
    width = max(map(len, rows))
    ids = torch.tensor([[1] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def jacobi_drafter(target, layout) -> JacobiDrafter:
    """SJD's drafter for ``layout``: random drafts, a row's first position drafted from the one above."""
    return JacobiDrafter(target.vocab_size, "repeat_above", grid_width=layout.row_length)


def run_mode(target, prefix, layout, sampling, window, seed: int, device):
    """One image; returns its timings and statistics."""
    drafter = None if window is None else jacobi_drafter(target, layout)
    constraints = layout.constraints(target.vocab_size)
    gen = torch.Generator(device=device).manual_seed(seed)
    synchronize(device)
    t0 = time.perf_counter()
    tokens, stats = decode(target, prefix, layout.num_tokens, sampling, drafter=drafter, window=window or 1,
                           generator=gen, constraints=constraints)
    synchronize(device)
    seconds = time.perf_counter() - t0
    forwards = stats.target_forwards
    return dict(seconds=seconds, forwards=forwards, tokens_per_forward=layout.num_tokens / forwards,
                ms_per_forward=1e3 * seconds / forwards, tokens=tokens)


def copy_bandwidth(device, nbytes: int = 2 ** 30, repeats: int = 10) -> float:
    """Bytes per second the device's memory moves: the median of ``repeats`` copies of ``nbytes``
    (each reads and writes them)."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    synchronize(device)
    seconds = median_ms(synchronized(lambda: y.copy_(x), device), repeats, warmup=1) / 1e3
    return 2 * nbytes / seconds  # the 2 GiB are freed on return, before the model's timings


@torch.no_grad()
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--size", type=int, default=768, help="image side in pixels (16 per code)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="random text tokens in the prompt")
    parser.add_argument("--sjd-windows", nargs="*", default=["auto", "16"],
                        help="SJD runs: a fixed window W, or 'auto' (the pipeline's default policy)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the modes in turn this many times; each mode's median round is reported")
    parser.add_argument("--compile", choices=("off", "on", "both"), default="off",
                        help="the step: eager, compiled static (CUDA graphs on a GPU), or both in turn")
    parser.add_argument("--compile-mode", default="auto", help="torch.compile's mode for the compiled step")
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS),
                        help="the windows of the cost table (and compiled before it)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per window in the cost table")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the same vocabulary")
    parser.add_argument("--quantize", default=None, choices=sorted(QUANTIZE_SCHEMES),
                        help="quantise the decoder's linear layers (int4-weight needs CUDA)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--profile", action="store_true",
                        help="first print torch.profiler's busiest operations over a small image's AR decode")
    args = parser.parse_args(argv)
    if args.size % 32:
        raise SystemExit(f"--size must be a multiple of 32 pixels (Lumina's size tokens count 32-pixel cells), "
                         f"got {args.size}")
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    side = args.size // 16
    dims = TINY if args.tiny else FULL

    t0 = time.perf_counter()
    model = build_model(dims, device, dtype)
    synchronize(device)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    vq = sum(p.numel() for p in model.model.vqmodel.parameters())
    quantize_s = 0.0
    if args.quantize:
        t0 = time.perf_counter()
        for part in (model.model.layers, model.lm_head):
            quantize_model(part, args.quantize)
        synchronize(device)
        quantize_s = time.perf_counter() - t0
    vq_bytes = sum(tensor_bytes(p) for p in model.model.vqmodel.parameters())
    # what a decode step reads (not the VQ encoder): the stored bytes, packed where quantised
    weight_bytes = sum(tensor_bytes(p) for p in model.parameters()) - vq_bytes
    target = UnifiedImageLM(model)
    layout = chameleon_layout(model.config.vocabulary_map, side, side)
    sampling = SamplingConfig(guidance_scale=4.0, top_k=2000)
    prefix = model_prefix(layout, model.config.vocabulary_map, args.prompt_tokens, device, True)

    import transformers
    info = dict(machine=machine_name(device), platform=platform.platform(), torch=torch.__version__,
                transformers=transformers.__version__, dtype=args.dtype, size=args.size,
                tokens_per_image=layout.num_tokens, prompt_tokens=prefix[0].shape[1],
                parameters_decoder=params - vq, build_s=round(build_s, 1), tiny=args.tiny,
                quantize=args.quantize, quantize_s=round(quantize_s, 1))
    print(json.dumps(info))

    # warm-up: a small image through both paths (kernels, allocator)
    small = chameleon_layout(model.config.vocabulary_map, 4, 4)
    warm_prefix = model_prefix(small, model.config.vocabulary_map, args.prompt_tokens, device, True)
    for window in (None, 8):
        run_mode(target, warm_prefix, small, sampling, window, 0, device)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            run_mode(target, warm_prefix, small, sampling, None, 0, device)
        key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        for sort in dict.fromkeys(("self_cpu_time_total", key)):
            print(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60))

    bandwidth = copy_bandwidth(device)
    limit_ms = 1e3 * weight_bytes / bandwidth
    print(f"\nweights {weight_bytes / 1e9:.1f} GB, copy bandwidth {bandwidth / 1e9:.0f} GB/s: "
          f"a forward's bandwidth limit {limit_ms:.2f} ms")
    # a whole image's cache once, untimed (see the module's docstring)
    first = target.prefill(prefix, layout.num_tokens)
    target.forward_window(torch.zeros(first.shape[0], layout.num_tokens, dtype=torch.long, device=first.device), 0)

    kinds = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    steps, rounds = {}, {}
    for compiled in kinds:
        kind = "compiled" if compiled else "eager"
        target.compile_step(compiled, **({"mode": args.compile_mode} if compiled else {}))
        compile_s = steps_compile_s = 0.0
        if compiled:
            t0 = time.perf_counter()
            target.precompile(prefix, layout.num_tokens, args.windows)  # the bare forwards of the cost table
            synchronize(device)
            compile_s = time.perf_counter() - t0
            # the decode's own step graphs: the rule and the constraints run inside them
            t0, constraints = time.perf_counter(), layout.constraints(target.vocab_size)
            precompile_decode(target, prefix, layout.num_tokens, sampling, [1], drafts=False,
                              constraints=constraints)
            for w in args.sjd_windows:
                precompile_decode(target, prefix, layout.num_tokens, sampling,
                                  args.windows if w == "auto" else [int(w)], drafts=True, auto=w == "auto",
                                  drafter=jacobi_drafter(target, layout), constraints=constraints)
            synchronize(device)
            steps_compile_s = time.perf_counter() - t0
            target.prefill(prefix, layout.num_tokens)  # precompiling leaves junk in the cache
        costs = measure_window_costs(target, prefix, layout.num_tokens, args.windows, repeats=args.repeats)
        steps[kind] = dict(compile_s=compile_s, steps_compile_s=steps_compile_s,
                           window_costs_ms={w: 1e3 * c for w, c in costs.items()})
        print(f"\n{kind} step (compiling its bare windows took {compile_s:.0f} s, the decode's steps "
              f"{steps[kind]['steps_compile_s']:.0f} s)\n")
        print("| W | ms / forward | x W=1 | x bandwidth limit |\n| ---: | ---: | ---: | ---: |")
        for w, c in costs.items():
            print(f"| {w} | {1e3 * c:.2f} | {c / costs[1]:.2f} | {1e3 * c / limit_ms:.2f} |", flush=True)
        runs = [(f"AR, {kind}", None)] + [
            (f"SJD W={w}, {kind}", WindowPolicy({prefix_rows(prefix): costs}) if w == "auto" else int(w))
            for w in args.sjd_windows]
        for _ in range(args.rounds):  # modes in turn, so a passing slowdown hits them alike
            for name, window in runs:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                r = run_mode(target, prefix, layout, sampling, window, 1234, device)
                r.pop("tokens")
                if device.type == "cuda":
                    r["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
                r["weight_gb_per_s"] = weight_bytes / (r["ms_per_forward"] / 1e3) / 1e9
                rounds.setdefault(name, []).append(r)
                print(json.dumps({name: {k: round(v, 4) for k, v in r.items()}}), flush=True)
    results = {name: sorted(rs, key=lambda r: r["seconds"])[(len(rs) - 1) // 2] for name, rs in rounds.items()}

    ar = results[f"AR, {'compiled' if kinds[-1] else 'eager'}"]
    print(f"\n{layout.num_tokens} tokens per image ({side}x{side} codes and row ends), batch 1, "
          f"{info['machine']}, {args.dtype}, median of {args.rounds} round(s); speed-up over the last AR; "
          f"bandwidth limit {limit_ms:.2f} ms a forward\n")
    print("| mode | forwards | tokens / forward | s / image | ms / forward | x bandwidth limit | weights GB/s | "
          "speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        print(f"| {name} | {r['forwards']} | {r['tokens_per_forward']:.2f} | {r['seconds']:.1f} | "
              f"{r['ms_per_forward']:.1f} | {r['ms_per_forward'] / limit_ms:.1f} | {r['weight_gb_per_s']:.0f} | "
              f"{ar['seconds'] / r['seconds']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(info, copy_bandwidth_gb_s=bandwidth / 1e9, limit_ms=limit_ms,
                                                   steps=steps, results=results), indent=1))

if __name__ == "__main__":
    main()
