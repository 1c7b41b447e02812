"""Text generation on the same core: any causal LM (through :mod:`visualspec.models.hf`) with the
model-free, Jacobi and draft-model drafters, exact or typical acceptance, and draft trees."""

from .generate import ACCEPTANCE, DRAFTERS, TextOutput, generate_text

__all__ = ["generate_text", "TextOutput", "DRAFTERS", "ACCEPTANCE"]
