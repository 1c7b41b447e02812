"""What int8 weights (torchao) do to a transformers Chameleon decode step on this machine (#48).

    pip install torchao          # not a dependency of visualspec: this benchmark only
    python benchmarks/quantized_step.py --model shapes-lumina
    python benchmarks/quantized_step.py --random-size 1024x8      # a random Chameleon, dim x layers
    python benchmarks/quantized_step.py --random-size 1024x8 --compile   # the static, compiled step

For rows (model rows: twice the images under guidance) and window W, at the middle of an image, it
times the engine's ``forward_window`` plus the cache crop (one decode step, eager) of the model in
float32 and after ``torchao.quantization.quantize_`` with each config (int8 weights only; int8
weights with dynamically quantised int8 activations), as medians of ``--repeats`` steps, and
reports the share of positions whose argmax is unchanged. ``--compile`` times the static,
compiled step (``HFCausalLM.compile_step``) of each instead of the eager one; its compiles happen
in the warm-up. On random weights that share is a
weak check (near ties flip); the quality cost on a trained model is measured with GenEval.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms  # noqa: E402
from visualspec.core.window_costs import machine_name  # noqa: E402
from visualspec.models.hf import HFCausalLM  # noqa: E402


def chameleon(args):
    if args.model:
        from visualspec import VisualSpecPipeline
        from visualspec.tools.loading import shipped_or_path

        return VisualSpecPipeline.from_pretrained(shipped_or_path(args.model)).transformer.eval()
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    dim, layers = (int(x) for x in args.random_size.split("x"))
    config = ChameleonConfig(vocab_size=8256, hidden_size=dim, intermediate_size=int(dim * 8 / 3) // 64 * 64,
                             num_hidden_layers=layers, num_attention_heads=dim // 128, num_key_value_heads=dim // 128,
                             max_position_embeddings=4096, vocabulary_map={"<image>": 8200}, vq_config={"embed_dim": 8})
    torch.manual_seed(0)
    return ChameleonForConditionalGeneration(config).eval()


def step_ms(model, rows: int, W: int, repeats: int, compile: bool = False):
    """Median ms of one window step at position ~100, and that step's logits."""
    V = model.config.vocab_size
    lm = HFCausalLM(model, raw_head=True)
    if compile:
        lm.compile_step()
    lm.prefill(torch.randint(5, V, (rows, 32), generator=torch.Generator().manual_seed(0)), 300)
    tokens = torch.randint(5, V, (rows, W), generator=torch.Generator().manual_seed(1))
    filler = torch.randint(5, V, (rows, 100), generator=torch.Generator().manual_seed(2))
    lm.forward_window(filler, 0)
    lengths = torch.full((rows,), 100)

    def step():
        out = lm.forward_window(tokens, 100)
        lm.crop(lengths)
        return out

    return median_ms(step, repeats, warmup=5), step()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a unified pipeline folder or shipped name (shapes-lumina)")
    parser.add_argument("--random-size", default="1024x8", help="without --model: a random Chameleon, DIMxLAYERS")
    parser.add_argument("--shapes", nargs="+", default=["2x1", "2x8", "32x1"], help="ROWSxW")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="the static, compiled step of each model")
    args = parser.parse_args(argv)
    try:
        from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                          quantize_)
    except ImportError:
        raise SystemExit("this benchmark needs torchao: pip install torchao") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    base = chameleon(args)
    params = sum(p.numel() for p in base.parameters())
    variants = {"int8 weights": Int8WeightOnlyConfig(),
                "int8 weights + activations": Int8DynamicActivationInt8WeightConfig()}
    quantized = {}
    for name, config in variants.items():
        quantized[name] = copy.deepcopy(base)
        quantize_(quantized[name], config)
    print(f"{args.model or 'random ' + args.random_size} ({params / 1e6:.0f}M parameters): {machine_name('cpu')}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{'static compiled step' if args.compile else 'eager step'}")
    print("| rows | W | float32 ms | " + " | ".join(f"{n} ms (speed-up, argmax kept)" for n in variants) + " |")
    print("| ---: | ---: | ---: | " + " | ".join("---:" for _ in variants) + " |")
    with torch.no_grad():
        for shape in args.shapes:
            rows, W = (int(x) for x in shape.split("x"))
            ref_ms, ref = step_ms(base, rows, W, args.repeats, args.compile)
            cells = []
            for name in variants:
                ms, out = step_ms(quantized[name], rows, W, args.repeats, args.compile)
                kept = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
                cells.append(f"{ms:.2f} ({ref_ms / ms:.2f}x, {kept:.3f})")
            print(f"| {rows} | {W} | {ref_ms:.2f} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
