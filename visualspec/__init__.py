"""visualspec: fast autoregressive image and video generation by speculative decoding.

The layers, each a subpackage with imports pointing only down (docs/architecture.md):

- :mod:`visualspec.core`: sampling, acceptance rules, the decode engine and its protocols, the
  window policy, statistics, the losslessness harness (torch only);
- :mod:`visualspec.drafters` and :mod:`visualspec.models` (installed from ``models/``);
- :mod:`visualspec.pipelines` (from ``pipelines/``), :mod:`visualspec.text`, :mod:`visualspec.video`;
- :mod:`visualspec.eval` and :mod:`visualspec.training`;
- :mod:`visualspec.tools`: the command line, batch generation and the benchmarks.

The public names below are imported on first use, so that importing the core never pulls in a
higher layer.
"""

__version__ = "0.1.0"

__all__ = ["VisualSpecPipeline", "SamplingConfig", "DecodeStats", "TokenModel", "decode", "generate_text",
           "TextOutput", "quantize_model"]

# every public name is imported on first use, so `import visualspec` (and the command line's
# start-up) loads neither torch nor diffusers until a name is needed
_WHERE = {"VisualSpecPipeline": "pipelines", "SamplingConfig": "core.sampling", "DecodeStats": "core.stats",
          "TokenModel": "core.engine", "decode": "core.engine", "generate_text": "text", "TextOutput": "text",
          "quantize_model": "models.quantized"}


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'visualspec' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
