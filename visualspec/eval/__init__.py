"""Scorers: GenEval-protocol evaluation and FID / CLIP score."""
