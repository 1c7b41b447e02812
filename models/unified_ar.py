"""Unified-vocabulary image generators (Lumina-mGPT on Chameleon, Emu3, Janus) as token models.

These are decoder-only language models that write an image after the prompt in the same token
sequence: an opening (image start, then tokens naming its size), then ``height`` rows of ``width``
codes, each row closed by a row-end token, then the tokens ending the image. :class:`ImageLayout`
declares that structure; the tokens it fixes (row ends, the ending) are structural tokens for the
engine (:class:`visualspec.core.constraints.TokenConstraints`), and the opening goes at the end of
the prompt, since it is fixed too.

Each family differs in a few places, gathered in one small class each (:func:`unified_family`
picks it from the transformers config's ``model_type``):

- ``chameleon`` (Lumina-mGPT): codes are the ``IMGIMG<digits as A-J>Z`` tokens; the opening names
  the size in 32-pixel cells; rows end with ``<reserved08799>``, the image with ``<eoss>``; the
  unconditional context of guidance is the opening alone. The image tokenizer is a separate
  component (transformers' Chameleon has no VQ decoder).
- ``emu3``: codes are the ``<|visual token%06d|>`` tokens; the opening is ``<|image start|>``, the
  size as text (``"{h}*{w}"`` in codes), ``<|image token|>``; rows end with ``<|extra_200|>``, the
  image with ``<|extra_201|>`` and ``<|image end|>``; guidance as Lumina's. The VQ is the model's.
- ``janus``: codes have their own embeddings and head (generated ids are codes); no row ends and
  no ending; the opening is ``<begin_of_image>``; the unconditional context is the prompt with
  every token but BOS and the opening replaced by padding, as Janus's ``generate`` does. The VQ is
  the model's.

:class:`UnifiedImageLM` is the transformers adapter (:class:`visualspec.models.hf.HFCausalLM`)
reading the LM head's raw logits (transformers' Chameleon masks image tokens out of its logits);
:class:`JanusImageLM` feeds generated codes through Janus's generation embeddings and reads its
generation head.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from visualspec.core.checks import check_positive_int
from visualspec.core.constraints import TokenConstraints

from .hf import HFCausalLM


@dataclass(frozen=True)
class ImageLayout:
    """Where an image's tokens go in the generated sequence.

    - ``code_tokens``: the token id of each image code (code c is token ``code_tokens[c]``);
    - ``height``, ``width``: the code grid;
    - ``row_end``: the token closing every row (None: rows are not closed, as in Janus);
    - ``ending``: the tokens after the last row (Lumina: the end of image; Emu3: two);
    - ``opening``: the tokens that open the image (image start, size tokens), put at the end of
      the prompt rather than generated, as the layout fixes them.
    """

    code_tokens: tuple[int, ...]
    height: int
    width: int
    row_end: int | None = None
    ending: tuple[int, ...] = ()
    opening: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("height", "width"):
            check_positive_int(f"the image {name} in codes", getattr(self, name))
        if not self.code_tokens:
            raise ValueError("an image layout needs the token ids of its codes")
        structural = set(self.ending) | ({self.row_end} if self.row_end is not None else set())
        if structural & set(self.code_tokens):
            raise ValueError("a row-end or image-ending token is also an image code token")

    @property
    def row_length(self) -> int:
        """Tokens per generated row: the codes and the row end."""
        return self.width + (self.row_end is not None)

    @property
    def num_tokens(self) -> int:
        """Generated tokens of one image: every row, and the ending."""
        return self.height * self.row_length + len(self.ending)

    def forced(self) -> torch.Tensor:
        """(num_tokens,) long: the structural token of each generated position, -1 at codes."""
        forced = torch.full((self.num_tokens,), -1, dtype=torch.long)
        if self.row_end is not None:
            forced[self.row_length - 1::self.row_length] = self.row_end
        if self.ending:
            forced[-len(self.ending):] = torch.tensor(self.ending)
        return forced

    def constraints(self, vocab_size: int, guidance: torch.Tensor | None = None) -> TokenConstraints:
        """The engine's constraints: structural tokens forced, codes elsewhere, and ``guidance``, the
        guidance scale per generated position, if the model defines one (None: a constant scale)."""
        if max(self.code_tokens) >= vocab_size:
            raise ValueError(f"an image code token lies outside the model's vocabulary of {vocab_size}")
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        allowed[list(self.code_tokens)] = True
        return TokenConstraints(self.forced(), allowed, guidance)

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


def lumina2_guidance(scale: float, num_tokens: int, size_cells: int) -> torch.Tensor:
    """Lumina-mGPT 2.0's guidance scale at each of an image's ``num_tokens`` generated positions
    ((num_tokens,) float32); ``size_cells`` is the product of its two size tokens' cell counts.

    Its script lowers the scale before every generated token i = 0, 1, ...:

        s_i = max(4, s_{i-1} * (1 - t_i / L)),   s_{-1} = scale,   t_i = i + 2,   L = 4 * size_cells,

    t_i counting the tokens after the image start (the two size tokens, then i generated ones), and
    L the script's code count with version 1's 2 x 2 codes per cell (a quarter of 2.0's codes). As
    every factor is at most 1, this is ``max(4, scale * prod_{j <= i} max(0, 1 - t_j / L))``: the
    scale falls to 4 over the first tokens (about 50 of a 768 x 768 image's 9,312 at scale 7) and
    stays there, and a scale of 4 or less is 4 from the start."""
    t = torch.arange(num_tokens, dtype=torch.float64) + 2
    return (scale * torch.cumprod((1 - t / (4 * size_cells)).clamp(min=0), 0)).clamp(min=4.0).float()


GUIDANCE_SCHEDULES = ("constant", "lumina2")


class UnifiedImageLM(HFCausalLM):
    """A transformers unified-vocabulary model as a token model: the LM head's raw logits (image
    tokens included), a prefix of token ids and an attention mask (left padding, so the
    conditional prompt and the unconditional one of classifier-free guidance share a batch).
    Its window forward takes the engine's ``post`` (:meth:`HFCausalLM.forward_window`), so that a
    compiled step samples, verifies and (SJD) drafts and commits inside its graph."""

    def __init__(self, model):
        super().__init__(model, raw_head=True)


def chameleon_layout(vocabulary_map: dict, height: int, width: int, grid_tokens: bool = True,
                     code_tokens=None, codes_per_cell: int = 2) -> ImageLayout:
    """The Lumina-mGPT layout in a Chameleon vocabulary (``config.vocabulary_map``).

    Codes are the tokens named ``IMGIMG<digits as letters A-J>Z`` (code 12 is ``IMGIMGBCZ``;
    Lumina-mGPT 1), or the given ``code_tokens`` (Lumina-mGPT 2.0: ``155000 + code``). The image
    opens with ``<racm3:break>`` and, with ``grid_tokens``, the two size tokens
    ``<reserved{8800 + n}>`` for the height and width in 32-pixel cells of ``codes_per_cell`` codes
    a side (2 with Chameleon's 16x VQGAN, 4 with 2.0's 8x MoVQGAN); rows end with
    ``<reserved08799>`` and the image with ``<eoss>``.
    """
    if code_tokens is None:
        codes = {}
        for name, token in vocabulary_map.items():
            if name.startswith("IMGIMG") and name.endswith("Z") and len(name) > 7:
                digits = name[6:-1]
                if all("A" <= ch <= "J" for ch in digits):
                    codes[int("".join(str(ord(ch) - ord("A")) for ch in digits))] = int(token)
        if not codes or sorted(codes) != list(range(len(codes))):
            raise ValueError("this vocabulary has no complete set of Chameleon image codes (IMGIMG...Z tokens)")
        code_tokens = [codes[c] for c in range(len(codes))]

    def token(name):
        if name not in vocabulary_map:
            raise ValueError(f"this vocabulary has no {name} token, which Lumina-mGPT's image layout needs")
        return int(vocabulary_map[name])

    opening = [token("<racm3:break>")]
    if grid_tokens:
        n = codes_per_cell
        if height % n or width % n:
            raise ValueError(f"size tokens count 32-pixel cells of {n}x{n} codes; a {height}x{width} code grid "
                             f"is not made of them")
        opening += [token(f"<reserved{8800 + height // n:05d}>"), token(f"<reserved{8800 + width // n:05d}>")]
    return ImageLayout(tuple(int(t) for t in code_tokens), height, width, row_end=token("<reserved08799>"),
                       ending=(token("<eoss>"),), opening=tuple(opening))


class JanusImageLM(UnifiedImageLM):
    """Janus as a token model: the prompt goes through the language model's text embeddings; the
    generated ids are image codes, fed through the generation embeddings and aligner and scored by
    the generation head (``vocab_size`` is the codebook's size)."""

    def __init__(self, model):
        super().__init__(model)
        language = model.model.language_model
        self._cache_keyword = "cache" if "cache" in inspect.signature(language.forward).parameters \
            else "past_key_values"
        self.vocab_size = model.model.generation_head.vision_head.out_features
        self._prompt = False

    def prefill(self, prefix, max_new_tokens: int, static: bool | None = None, features: bool = False):
        self._prompt = True
        try:
            return super().prefill(prefix, max_new_tokens, static, features)
        finally:
            self._prompt = False

    def _logits(self, last_only: bool = False, features: bool | tuple = False, **inputs):
        if isinstance(features, tuple):
            raise ValueError("Janus's adapter returns the generation head's input only, not the hidden states "
                             f"{list(features)} a fusing (EAGLE-3) feature drafter reads")
        ids = inputs.pop("input_ids")
        embed = self.model.get_input_embeddings() if self._prompt else self.model.prepare_embeddings_for_image_generation
        inputs[self._cache_keyword] = inputs.pop("past_key_values")
        hidden = self.model.model.language_model(inputs_embeds=embed(ids), **inputs).last_hidden_state
        logits = self.model.model.generation_head(hidden[:, -1:] if last_only else hidden)
        return (logits, hidden) if features else logits

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.prepare_embeddings_for_image_generation(tokens)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.model.generation_head(features).float()

    @property
    def feature_size(self) -> int:
        return self.model.config.text_config.hidden_size


class UnifiedFamily:
    """What one family of unified-vocabulary models does its own way; ``model`` is its transformers
    model, ``vq_model`` the separate image tokenizer where the family has none inside."""

    model_type = ""

    def __init__(self, model, vq_model=None):
        self.model, self.vq_model = model, vq_model

    def check_components(self) -> None:
        """Raise a ValueError if the pipeline lacks a component this family needs, or has one it
        would ignore."""
        if self.vq_model is not None:
            raise ValueError(f"a {self.model_type} model decodes with its own VQ; pass no vq_model")

    def layout(self, height: int, width: int, tokenizer, grid_tokens: bool = True, grid_cell_codes: int = 2,
               code_token_offset: int | None = None) -> ImageLayout:
        """The layout of a ``height`` x ``width`` code grid; ``grid_tokens``, ``grid_cell_codes`` and
        ``code_token_offset`` are Lumina's (see :func:`chameleon_layout`)."""
        raise NotImplementedError

    def token_model(self):
        return UnifiedImageLM(self.model)

    def unconditional(self, ids: list[int], layout: ImageLayout) -> list[int]:
        """The unconditional row of guidance for a conditional row ``ids`` (prompt and opening)."""
        return list(layout.opening)

    @property
    def image_tokenizer(self):
        return self.model.model.vqmodel

    def codebook(self) -> torch.Tensor:
        """(codes, dim): the image tokenizer's code vectors (LANTERN's neighbourhoods)."""
        return self.image_tokenizer.quantize.embedding.weight.detach().float()

    def pixels_per_code(self) -> int:
        return int(self.image_tokenizer.spatial_scale_factor)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Code grids (B, h, w) -> images (B, 3, H, W), nominally in [-1, 1]."""
        return self.image_tokenizer.decode(codes)


class ChameleonFamily(UnifiedFamily):
    model_type = "chameleon"

    def layout(self, height, width, tokenizer, grid_tokens=True, grid_cell_codes=2, code_token_offset=None):
        codes = None
        if code_token_offset is not None:  # Lumina-mGPT 2.0: code c is token offset + c
            codes = range(code_token_offset, code_token_offset + self.image_tokenizer.codebook_size)
        return chameleon_layout(self.model.config.vocabulary_map, height, width, grid_tokens, codes,
                                codes_per_cell=grid_cell_codes)

    def check_components(self):
        if self.vq_model is None:
            raise ValueError("a Chameleon-family pipeline needs an image tokenizer (vq_model): transformers' "
                             "Chameleon has no VQ decoder")

    @property
    def image_tokenizer(self):
        return self.vq_model

    def codebook(self):
        return self.vq_model.codebook_vectors().detach().float()

    def pixels_per_code(self):
        return int(self.image_tokenizer.downsample_factor)

    def decode(self, codes):
        B, h, w = codes.shape
        shape = (B, self.image_tokenizer.config.codebook_embed_dim, h, w)
        return self.image_tokenizer.decode_code(codes.reshape(B, h * w), shape=shape)


class Emu3Family(UnifiedFamily):
    model_type = "emu3"

    def layout(self, height, width, tokenizer, grid_tokens=True, grid_cell_codes=2, code_token_offset=None):
        vocab = self.model.config.vocabulary_map
        size = tokenizer(f"{height}*{width}", add_special_tokens=False).input_ids
        return emu3_layout(vocab, height, width, size)


class JanusFamily(UnifiedFamily):
    model_type = "janus"

    def layout(self, height, width, tokenizer, grid_tokens=True, grid_cell_codes=2, code_token_offset=None):
        grid = tuple(self.image_tokenizer.quantize.quant_state_dims)
        if (height, width) != grid:
            raise ValueError(f"this Janus model makes {grid[0]}x{grid[1]} code grids, not {height}x{width}")
        return ImageLayout(tuple(range(self.image_tokenizer.config.num_embeddings)), height, width,
                           opening=(self.begin_of_image(tokenizer),))

    def begin_of_image(self, tokenizer) -> int:
        token = tokenizer.convert_tokens_to_ids("<begin_of_image>")
        if token is None or token == tokenizer.unk_token_id:
            raise ValueError("this tokenizer has no <begin_of_image> token, which Janus's image layout needs")
        return int(token)

    def token_model(self):
        return JanusImageLM(self.model)

    def unconditional(self, ids, layout):
        keep = {self.model.config.text_config.bos_token_id, *layout.opening}
        pad = self.model.config.text_config.pad_token_id
        return [t if t in keep else pad for t in ids]

    def pixels_per_code(self):
        return 2 ** (len(self.image_tokenizer.config.channel_multiplier) - 1)

    def decode(self, codes):
        return self.image_tokenizer.decode(codes.flatten(1))


FAMILIES = {f.model_type: f for f in (ChameleonFamily, Emu3Family, JanusFamily)}


def unified_family(model, vq_model=None) -> UnifiedFamily:
    """The family of a transformers model, from its config's ``model_type``, or a ValueError naming it."""
    kind = getattr(model.config, "model_type", None)
    if kind not in FAMILIES:
        raise ValueError(f"a {type(model).__name__} (model_type {kind!r}) is not a unified-vocabulary image "
                         f"generator this pipeline knows; it knows {sorted(FAMILIES)}")
    return FAMILIES[kind](model, vq_model)


def emu3_layout(vocabulary_map: dict, height: int, width: int, size_tokens) -> ImageLayout:
    """Emu3's layout: codes are ``<|visual token%06d|>``; the opening is ``<|image start|>``, the
    ``size_tokens`` (the text ``"{height}*{width}"`` through the tokenizer) and ``<|image token|>``;
    rows end with ``<|extra_200|>``; the image ends with ``<|extra_201|>`` then ``<|image end|>``."""
    codes = {}
    for name, token in vocabulary_map.items():
        if name.startswith("<|visual token") and name.endswith("|>") and name[14:-2].isdigit():
            codes[int(name[14:-2])] = int(token)
    if not codes or sorted(codes) != list(range(len(codes))):
        raise ValueError("this vocabulary has no complete set of Emu3 image codes (<|visual token...|> tokens)")

    def token(name):
        if name not in vocabulary_map:
            raise ValueError(f"this vocabulary has no {name} token, which Emu3's image layout needs")
        return int(vocabulary_map[name])

    opening = (token("<|image start|>"), *map(int, size_tokens), token("<|image token|>"))
    return ImageLayout(tuple(codes[c] for c in range(len(codes))), height, width, row_end=token("<|extra_200|>"),
                       ending=(token("<|extra_201|>"), token("<|image end|>")), opening=opening)
