"""visualspec: fast autoregressive image and video generation by speculative decoding.

The layers, each a subpackage with imports pointing only down (docs/architecture.md):

- :mod:`visualspec.core`: sampling, acceptance rules, the decode engine and its protocols, the
  window policy, statistics, the losslessness harness (torch only);
- :mod:`visualspec.drafters` and :mod:`visualspec.models` (installed from ``models/``);
- :mod:`visualspec.pipelines` (from ``pipelines/``), :mod:`visualspec.text`, :mod:`visualspec.video`;
- :mod:`visualspec.eval` and :mod:`visualspec.training`;
- :mod:`visualspec.tools`: the command line, batch generation and the benchmarks.

The public names below are the core's, plus two entry points imported on first use, so that
importing the core never pulls in a higher layer.
"""

__version__ = "0.1.0"

from .core.engine import TokenModel, decode  # noqa: E402
from .core.sampling import SamplingConfig  # noqa: E402
from .core.stats import DecodeStats  # noqa: E402

__all__ = ["VisualSpecPipeline", "SamplingConfig", "DecodeStats", "TokenModel", "decode", "generate_text",
           "TextOutput"]


def __getattr__(name):
    if name == "VisualSpecPipeline":
        from .pipelines import VisualSpecPipeline

        return VisualSpecPipeline
    if name in ("generate_text", "TextOutput"):
        from . import text

        return getattr(text, name)
    raise AttributeError(f"module 'visualspec' has no attribute {name!r}")
