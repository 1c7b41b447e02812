"""The compiled diffusion-head sampler on the continuous-token recipe's shapes (#48).

    python benchmarks/continuous_compiled.py
    python benchmarks/continuous_compiled.py --batch-sizes 1 4 --images 8

No trained continuous-token model ships (its recipe does not train on this CPU), so this builds
the pipeline ``visualspec train-continuous`` writes with random weights: the same shapes (a
160-wide, 6-layer target with a 3 x 160 head, a 96-wide, 3-layer draft with a 2 x 96 head, 8-number
tokens on a 16 x 16 grid, 50 sampling steps, the shipped text encoder), so the same cost per step.
Acceptance on random weights says nothing about a trained pair; the speed of each step does.

It runs ``visualspec bench``'s side-by-side benchmark (modes interleaved, warm-up calls untimed:
they hold the compiles, whose time is printed first) with AR and CSpD, eager and compiled.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from visualspec.core.window_costs import machine_name  # noqa: E402


def recipe_shaped_pipeline():
    from visualspec.assets import SHAPES_T2I
    from visualspec.models.kl_vae import KLAutoencoder
    from visualspec.pipelines import ContinuousARPipeline, VisualSpecPipeline
    from visualspec.training.continuous import ContinuousShapesConfig, build_ar

    cfg = ContinuousShapesConfig()
    text = VisualSpecPipeline.from_pretrained(SHAPES_T2I)
    caption = (text.transformer.config.caption_dim, text.transformer.config.cls_token_num)
    torch.manual_seed(0)
    kl = KLAutoencoder(embed_dim=cfg.token_dim, ch=cfg.kl_channels, ch_mult=(1, 2, 2), num_res_blocks=1).eval()
    pipe = ContinuousARPipeline(transformer=build_ar(cfg, "target", *caption).eval(), vae=kl,
                                text_encoder=text.text_encoder, tokenizer=text.tokenizer,
                                draft_model=build_ar(cfg, "draft", *caption).eval())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--images", type=int, default=4, help="images per mode and batch size")
    parser.add_argument("--modes", default="ar,ar+compiled,cspd,cspd+compiled")
    args = parser.parse_args(argv)
    from visualspec.tools.bench import run_benchmark

    pipe = recipe_shaped_pipeline()
    print(f"machine: {machine_name(torch.device('cpu'))}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    pipe(["a photo of a red circle"], decoding="cspd", compile=True, seed=0, output_type="latent")
    print(f"first compiled call (compiles both heads' chunks, one row): {time.perf_counter() - t0:.1f} s")
    for batch_size in args.batch_sizes:
        result = run_benchmark(pipe, modes=args.modes.split(","), images=args.images, batch_size=batch_size)
        print(f"\nbatch {batch_size}, {args.images} images per mode, speed-ups over {result['baseline']}")
        print(result["table"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
