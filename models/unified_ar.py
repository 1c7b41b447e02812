"""Unified-vocabulary image generators (Lumina-mGPT, Chameleon, Emu3) as token models.

These are decoder-only language models whose vocabulary holds text and image codes. An image is
generated after the prompt as an opening (image start, then tokens naming its size), then
``height`` rows of ``width`` codes, each row closed by a row-end token, then an end-of-image
token. :class:`ImageLayout` declares that structure; the tokens it fixes (row ends, the end) are
structural tokens for the engine (:class:`visualspec.core.constraints.TokenConstraints`), and the
opening goes at the end of the prompt, since it is fixed too.

:class:`UnifiedImageLM` is the transformers adapter (:class:`visualspec.models.hf.HFCausalLM`)
reading the LM head's raw logits: transformers' Chameleon masks image tokens out of its logits.
:func:`chameleon_layout` builds the layout of a Chameleon / Lumina-mGPT vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from visualspec.core.constraints import TokenConstraints

from .hf import HFCausalLM


@dataclass(frozen=True)
class ImageLayout:
    """Where an image's tokens go in the generated sequence.

    - ``code_tokens``: the token id of each image code (code c is token ``code_tokens[c]``);
    - ``height``, ``width``: the code grid;
    - ``row_end``: the token closing every row (None: rows are not closed, as in Janus);
    - ``end``: the token after the last row (None: none);
    - ``opening``: the tokens that open the image (image start, size tokens), put at the end of
      the prompt rather than generated, as the layout fixes them.
    """

    code_tokens: tuple[int, ...]
    height: int
    width: int
    row_end: int | None = None
    end: int | None = None
    opening: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("height", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"the image {name} in codes must be an integer >= 1, got {value!r}")
        if not self.code_tokens:
            raise ValueError("an image layout needs the token ids of its codes")
        structural = {t for t in (self.row_end, self.end) if t is not None}
        if structural & set(self.code_tokens):
            raise ValueError("a row-end or end-of-image token is also an image code token")

    @property
    def row_length(self) -> int:
        """Tokens per generated row: the codes and the row end."""
        return self.width + (self.row_end is not None)

    @property
    def num_tokens(self) -> int:
        """Generated tokens of one image: every row, and the end token."""
        return self.height * self.row_length + (self.end is not None)

    def forced(self) -> torch.Tensor:
        """(num_tokens,) long: the structural token of each generated position, -1 at codes."""
        forced = torch.full((self.num_tokens,), -1, dtype=torch.long)
        if self.row_end is not None:
            forced[self.row_length - 1::self.row_length] = self.row_end
        if self.end is not None:
            forced[-1] = self.end
        return forced

    def constraints(self, vocab_size: int) -> TokenConstraints:
        """The engine's constraints: structural tokens forced, codes elsewhere."""
        if max(self.code_tokens) >= vocab_size:
            raise ValueError(f"an image code token lies outside the model's vocabulary of {vocab_size}")
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        allowed[list(self.code_tokens)] = True
        return TokenConstraints(self.forced(), allowed)

    def codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Generated tokens (B, num_tokens) -> image codes (B, height, width)."""
        if tokens.shape[-1] != self.num_tokens:
            raise ValueError(f"this layout generates {self.num_tokens} tokens per image, got {tokens.shape[-1]}")
        grid = tokens[:, :self.height * self.row_length].reshape(-1, self.height, self.row_length)[..., :self.width]
        lookup = torch.full((int(max(self.code_tokens)) + 1,), -1, dtype=torch.long, device=tokens.device)
        lookup[torch.tensor(self.code_tokens, device=tokens.device)] = torch.arange(len(self.code_tokens),
                                                                                 device=tokens.device)
        codes = lookup[grid.clamp(0, lookup.shape[0] - 1)]
        if bool((codes < 0).any()) or bool((grid >= lookup.shape[0]).any()):
            raise ValueError("a generated image position holds a token that is not an image code")
        return codes


class UnifiedImageLM(HFCausalLM):
    """A transformers unified-vocabulary model as a token model: the LM head's raw logits (image
    tokens included), a prefix of token ids and an attention mask (left padding, so the
    conditional prompt and the unconditional one of classifier-free guidance share a batch)."""

    def __init__(self, model):
        super().__init__(model, raw_head=True)


def chameleon_layout(vocabulary_map: dict, height: int, width: int, grid_tokens: bool = True) -> ImageLayout:
    """The Lumina-mGPT layout in a Chameleon vocabulary (``config.vocabulary_map``).

    Codes are the tokens named ``IMGIMG<digits as letters A-J>Z`` (code 12 is ``IMGIMGBCZ``); the
    image opens with ``<racm3:break>`` and, with ``grid_tokens``, the two size tokens
    ``<reserved{8800 + n}>`` for the height and width in 32-pixel cells (two codes each); rows end
    with ``<reserved08799>`` and the image with ``<eoss>``.
    """
    codes = {}
    for name, token in vocabulary_map.items():
        if name.startswith("IMGIMG") and name.endswith("Z") and len(name) > 7:
            digits = name[6:-1]
            if all("A" <= ch <= "J" for ch in digits):
                codes[int("".join(str(ord(ch) - ord("A")) for ch in digits))] = int(token)
    if not codes or sorted(codes) != list(range(len(codes))):
        raise ValueError("this vocabulary has no complete set of Chameleon image codes (IMGIMG...Z tokens)")

    def token(name):
        if name not in vocabulary_map:
            raise ValueError(f"this vocabulary has no {name} token, which Lumina-mGPT's image layout needs")
        return int(vocabulary_map[name])

    opening = [token("<racm3:break>")]
    if grid_tokens:
        if height % 2 or width % 2:
            raise ValueError(f"size tokens count 32-pixel cells of 2x2 codes; a {height}x{width} code grid has none")
        opening += [token(f"<reserved{8800 + height // 2:05d}>"), token(f"<reserved{8800 + width // 2:05d}>")]
    return ImageLayout(tuple(codes[c] for c in range(len(codes))), height, width,
                       row_end=token("<reserved08799>"), end=token("<eoss>"), opening=tuple(opening))
