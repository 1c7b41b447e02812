"""Where block-sparse attention (InfLLM v2's block selection) starts to pay on this machine (#48).

    python benchmarks/sparse_attention.py                       # 7B-shaped heads, 1k to 32k keys
    python benchmarks/sparse_attention.py --lengths 2048 8192 --window 8

One decode step's attention of one layer, shaped as Lumina-mGPT 7B's (32 heads of 128, bfloat16
keys and values, ``--window`` queries), over N cached keys, timed two ways as medians of
``--repeats`` calls after a warm-up:

- dense: ``scaled_dot_product_attention`` over all N keys;
- block-sparse, InfLLM v2's selection at its paper setting: the keys in blocks of 64; each block
  scored by the queries against its mean key (the means are kept with the cache, so they are not
  timed); the heads share one selection, as one GQA group does; the first block, the last 32
  (the local window) and the 63 best-scoring others are attended: 96 blocks, 6,144 keys, through
  torch's compiled ``flex_attention`` with a block mask built each step (timed: the selection
  changes every step). Below 6,144 keys it selects everything, which is dense attention.

It prints milliseconds and the ratio per length, and the bytes of the whole cache a 7B step reads
(32 layers of keys and values) beside those of its weights, which bound a step long before the
attention does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms  # noqa: E402
from visualspec.core.window_costs import machine_name  # noqa: E402

HEADS, HEAD_DIM, LAYERS, WEIGHT_BYTES = 32, 128, 32, 14e9  # Lumina-mGPT 7B in bfloat16
BLOCK, INITIAL, LOCAL, TOP = 64, 1, 32, 63  # InfLLM v2: 1 + 32 + 63 = 96 blocks, 6,144 keys


def select_blocks(q: torch.Tensor, block_means: torch.Tensor) -> torch.Tensor:
    """Indices (96,) of the blocks attended: the first, the last ``LOCAL`` and the ``TOP``
    best-scoring others, scored by ``softmax(q . mean key)`` summed over heads and queries."""
    n = block_means.shape[2]
    scores = (q @ block_means.transpose(-1, -2)).float().softmax(-1).sum((0, 1, 2))  # (n,)
    scores[:INITIAL] = float("inf")
    scores[n - LOCAL:] = float("inf")
    return scores.topk(INITIAL + LOCAL + TOP).indices.sort().values


def sparse_attention(q, k, v, block_means, flex):
    """Attention of ``q`` over the selected blocks of ``k``, ``v`` (B, H, N, D), N a multiple of 64:
    the selection as a block mask of torch's ``flex_attention`` (``flex``, compiled), which skips
    the other blocks without copying the selected ones (a gather copies 25 MB a layer at 6,144
    keys, slower than dense attention here)."""
    from torch.nn.attention.flex_attention import create_block_mask

    selected = torch.zeros(block_means.shape[2], dtype=torch.bool)
    selected[select_blocks(q, block_means)] = True
    mask = create_block_mask(lambda b, h, qi, ki: selected[ki // BLOCK], 1, None, q.shape[2], k.shape[2],
                             device="cpu", BLOCK_SIZE=BLOCK)
    return flex(q, k, v, block_mask=mask)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 32768])
    parser.add_argument("--window", type=int, default=1, help="queries per step (1: AR, 8: an SJD window)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    print(f"{machine_name('cpu')}, {torch.get_num_threads()} threads, torch {torch.__version__}; one layer, "
          f"{HEADS} heads x {HEAD_DIM}, {dtype}, {args.window} quer{'y' if args.window == 1 else 'ies'}")
    print("| keys | dense ms | block-sparse ms | sparse speed-up | 7B cache bytes / weight bytes |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in args.lengths:
            n = n // BLOCK * BLOCK
            q = torch.randn(1, HEADS, args.window, HEAD_DIM, generator=gen).to(dtype)
            k = torch.randn(1, HEADS, n, HEAD_DIM, generator=gen).to(dtype)
            v = torch.randn(1, HEADS, n, HEAD_DIM, generator=gen).to(dtype)
            means = k.view(1, HEADS, n // BLOCK, BLOCK, HEAD_DIM).mean(3)
            dense = median_ms(lambda: F.scaled_dot_product_attention(q, k, v), args.repeats, warmup=3)
            if n > (INITIAL + LOCAL + TOP) * BLOCK:
                sparse = median_ms(lambda: sparse_attention(q, k, v, means, flex), args.repeats, warmup=3)
            else:
                sparse = dense  # every block is selected: dense attention
            cache = 2 * LAYERS * HEADS * HEAD_DIM * n * 2
            print(f"| {n} | {dense:.2f} | {sparse:.2f} | {dense / sparse:.2f}x | {cache / WEIGHT_BYTES:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
