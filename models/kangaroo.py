"""Kangaroo (Liu et al. 2024, arXiv 2404.18911): a self-draft from the target's first layers.

The draft model is the target's first E layers (its *first early exit*), then a small trained
adapter, then the target's own LM head:

    h_E   = layers[:E](embed(x))                    the target's modules, frozen, not copied
    a     = h_E + attention(rmsnorm_in(h_E))        the adapter: one attention block, no MLP
    q     = softmax(head(rmsnorm_out(a)))           the adapter's final norm, the target's head

Only the adapter (two RMSNorms and one multi-head attention, :class:`KangarooAdapter`) is trained
and saved, with the target's weight hash. :func:`kangaroo_lm` puts the pieces together as one
transformers ``LlamaForCausalLM`` of E + 1 layers whose embedding, first E layers and head *are*
the target's modules and whose last layer is the adapter (an attention-only decoder layer; its
final norm is the model's norm). So the draft is an ordinary draft model for
:class:`visualspec.models.hf.HFCausalLM` and :class:`visualspec.drafters.DraftModelDrafter`: its
own KV cache (a static one and a compiled step with ``compile=True``), trees and VocabTrim work
unchanged, and the drafter's ``stop_below`` is Kangaroo's *second early exit* (stop drafting once
the draft's probability of its latest token falls below a threshold; the adapter records its
default, ``stop_below``).

Not built: Kangaroo's verification runs only the target's layers E.. on the drafted tokens'
stored shallow states; here the target's window forward recomputes layers 0..E-1 for the window.
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn
from transformers.models.llama import modeling_llama

from .feature_drafter import weights_hash

CLASS_NAME = "KangarooAdapter"  # the ``_class_name`` of a saved adapter's config.json


class NoMLP(nn.Module):
    """The adapter layer's MLP branch: zero, so the decoder layer is ``x + attention(norm(x))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def check_stop_below(stop_below) -> float:
    """The exit threshold as a float: a probability in [0, 1] (a ValueError names any other value)."""
    if isinstance(stop_below, bool) or not isinstance(stop_below, (int, float)) or not 0.0 <= stop_below <= 1.0:
        raise ValueError(f"Kangaroo's exit threshold stop_below must be a probability in [0, 1], got {stop_below!r}")
    return float(stop_below)


class KangarooAdapter(ModelMixin, ConfigMixin):
    """Kangaroo's adapter for a Llama target: ``layer`` (input RMSNorm and one multi-head
    self-attention at layer index ``exit_layer``, no MLP) and ``norm`` (the final RMSNorm).

    ``exit_layer`` is E, the target layers the draft runs before the adapter; ``stop_below`` the
    default threshold of the second exit; ``target_hash`` the hash of the weights of the target
    it was trained for (:func:`visualspec.models.feature_drafter.weights_hash`).
    """

    @register_to_config
    def __init__(self, exit_layer: int = 1, hidden_size: int = 256, num_attention_heads: int = 4,
                 num_key_value_heads: int = 4, head_dim: int = 64, rms_norm_eps: float = 1e-6,
                 attention_bias: bool = False, stop_below: float = 0.6, target_hash: str = ""):
        super().__init__()
        if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or exit_layer < 1:
            raise ValueError(f"exit_layer must be an integer >= 1 (the target layers before the adapter), "
                             f"got {exit_layer!r}")
        check_stop_below(stop_below)
        config = modeling_llama.LlamaConfig(hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                             num_key_value_heads=num_key_value_heads, head_dim=head_dim, rms_norm_eps=rms_norm_eps,
                             attention_bias=attention_bias, intermediate_size=1, num_hidden_layers=exit_layer + 1)
        self.layer = modeling_llama.LlamaDecoderLayer(config, layer_idx=exit_layer)
        self.layer.mlp, self.layer.post_attention_layernorm = NoMLP(), nn.Identity()
        self.norm = modeling_llama.LlamaRMSNorm(hidden_size, eps=rms_norm_eps)

    @classmethod
    def for_target(cls, target, exit_layer: int, stop_below: float = 0.6) -> KangarooAdapter:
        """An adapter shaped for ``target`` (a transformers Llama), started from the target's own
        layer ``exit_layer`` (its input norm and attention) and final norm: at step 0 the draft is
        the target with layers E+1.. and layer E's MLP skipped."""
        config = _check_llama(target)
        layers = config.num_hidden_layers
        if not 1 <= exit_layer < layers:
            raise ValueError(f"exit_layer must be between 1 and {layers - 1} for a target of {layers} layers, "
                             f"got {exit_layer}")
        adapter = cls(exit_layer=exit_layer, hidden_size=config.hidden_size,
                      num_attention_heads=config.num_attention_heads,
                      num_key_value_heads=config.num_key_value_heads, head_dim=_head_dim(config),
                      rms_norm_eps=config.rms_norm_eps, attention_bias=config.attention_bias,
                      stop_below=stop_below, target_hash=weights_hash(target))
        source = target.model.layers[exit_layer]
        adapter.layer.input_layernorm.load_state_dict(source.input_layernorm.state_dict())
        adapter.layer.self_attn.load_state_dict(source.self_attn.state_dict())
        adapter.norm.load_state_dict(target.model.norm.state_dict())
        return nn.Module.to(adapter, device=target.device, dtype=target.dtype)  # (diffusers' to() warns of nothing)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _check_llama(target):
    """The target's config; a ValueError names a target that is not a transformers Llama."""
    config = getattr(target, "config", None)
    if getattr(config, "model_type", None) != "llama" or not hasattr(getattr(target, "model", None), "layers"):
        raise ValueError(f"Kangaroo builds on a transformers Llama (LlamaForCausalLM); got {type(target).__name__}")
    return config


def check_target(adapter: KangarooAdapter, target) -> None:
    """An adapter must fit the target's shape and should have been trained for it (its
    ``target_hash``, when recorded): a mismatch is a ValueError that names both."""
    config, own = _check_llama(target), adapter.config
    shape = ("hidden_size", "num_attention_heads", "num_key_value_heads")
    theirs = {name: getattr(config, name) for name in shape} | {"head_dim": _head_dim(config)}
    ours = {name: getattr(own, name) for name in theirs}
    if ours != theirs or own.exit_layer >= config.num_hidden_layers:
        raise ValueError(f"the Kangaroo adapter (exit layer {own.exit_layer}, {ours}) does not fit this target "
                         f"({config.num_hidden_layers} layers, {theirs}): it was trained for another target")
    check_hash(own.target_hash, target)


def check_hash(recorded: str, target) -> None:
    """A ValueError naming both hashes when ``recorded`` (a Kangaroo adapter's target hash; empty:
    not recorded) is not the hash of ``target``'s weights."""
    if recorded and recorded != weights_hash(target):
        raise ValueError(f"the Kangaroo adapter was trained against a target whose weights hash to {recorded}; "
                         f"this target's hash to {weights_hash(target)}. Train one for it "
                         f"(visualspec train-drafter --kind kangaroo)")


def kangaroo_lm(adapter: KangarooAdapter, target):
    """The draft model: a ``LlamaForCausalLM`` of E + 1 layers whose embedding, rotary table,
    first E layers and LM head are ``target``'s own modules (shared, not copied) and whose last
    layer and final norm are ``adapter``'s. Its ``config.kangaroo`` records the exit layer, the
    exit threshold and the target hash (:func:`kangaroo_info`)."""
    import copy

    check_target(adapter, target)
    E = adapter.config.exit_layer
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = E + 1
    config.kangaroo = {"exit_layer": E, "stop_below": adapter.config.stop_below,
                       "target_hash": adapter.config.target_hash}
    with torch.device("meta"):
        lm = type(target)(config)
    lm.model.embed_tokens = target.model.embed_tokens
    lm.model.rotary_emb = target.model.rotary_emb
    lm.model.layers = nn.ModuleList([*target.model.layers[:E], adapter.layer])
    lm.model.norm = adapter.norm
    lm.lm_head = target.lm_head
    adapter.layer.self_attn.config = config  # the attention implementation the masks are made for
    stray = [name for name, t in (*lm.named_parameters(), *lm.named_buffers()) if t.is_meta]
    if stray:
        raise RuntimeError(f"the Kangaroo draft model has tensors that are not the target's or the adapter's: {stray}")
    return lm.eval()


def kangaroo_info(model) -> dict | None:
    """``{"exit_layer", "stop_below", "target_hash"}`` of a draft model :func:`kangaroo_lm` built,
    else None."""
    info = getattr(getattr(model, "config", None), "kangaroo", None)
    return info if isinstance(info, dict) else None


def is_kangaroo_folder(folder) -> bool:
    """Whether ``folder`` holds a saved :class:`KangarooAdapter` (its config's ``_class_name``)."""
    path = Path(folder) / "config.json"
    try:
        return path.is_file() and json.loads(path.read_text()).get("_class_name") == CLASS_NAME
    except (OSError, ValueError):
        return False


# the draft models built per target and folder: generate_text called with a folder reuses one (and
# its compiled step) instead of building a new one each call
_built: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


def load_kangaroo(folder, target):
    """The Kangaroo draft model of the adapter saved in ``folder`` around ``target`` (in the
    target's dtype and device; :func:`kangaroo_lm`). A ValueError names a folder that holds no
    adapter, and both hashes when the adapter was trained for another target. Built once per
    target and folder (until the folder's weights change)."""
    path = Path(folder)
    if not is_kangaroo_folder(path):
        raise ValueError(f"{str(path)!r} is not a Kangaroo adapter folder (no config.json with "
                         f"_class_name {CLASS_NAME!r}; visualspec train-drafter --kind kangaroo writes one)")
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(path.iterdir()) if p.is_file())
    key = (str(path.resolve()), stamp)
    built = _built.setdefault(target, {})
    if key in built:
        check_hash(kangaroo_info(built[key])["target_hash"], target)
        return built[key]
    default = torch.get_default_dtype()
    try:
        adapter = KangarooAdapter.from_pretrained(path, torch_dtype=target.dtype).to(target.device).eval()
    finally:  # diffusers sets the default dtype while it builds the model and leaves it so if that raises
        torch.set_default_dtype(default)
    built[key] = lm = kangaroo_lm(adapter.requires_grad_(False), target)
    return lm
