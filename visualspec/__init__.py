"""visualspec: fast autoregressive image and video generation by speculative decoding.

The core (sampling, verification rules, drafters, the decode engine, statistics) lives in this
package; models in :mod:`visualspec.models`, pipelines in :mod:`visualspec.pipelines`.
"""

__version__ = "0.1.0"

from .engine import TokenModel, decode  # noqa: E402
from .sampling import SamplingConfig  # noqa: E402
from .stats import DecodeStats  # noqa: E402
from .text import TextOutput, generate_text  # noqa: E402

__all__ = ["VisualSpecPipeline", "SamplingConfig", "DecodeStats", "TokenModel", "decode", "generate_text",
           "TextOutput"]


def __getattr__(name):
    # pipelines build on the core, so the public pipeline class is imported lazily
    if name == "VisualSpecPipeline":
        from .pipelines import VisualSpecPipeline

        return VisualSpecPipeline
    raise AttributeError(f"module 'visualspec' has no attribute {name!r}")
