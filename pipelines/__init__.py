"""Pipelines: thin compositions of models (visualspec.models) with the decode core."""

from .base import VisualSpecPipeline, register_pipeline
from .image import ImagePipeline, TokenImagePipeline, VisualSpecImageOutput
from .llamagen import LlamaGenPipeline
from .any_order import AnyOrderPipeline
from .continuous import ContinuousARPipeline
from .mar import MARPipeline
from .nfd import NextFramePipeline, VisualSpecVideoOutput, export_video
from .unified import UnifiedARPipeline

__all__ = ["VisualSpecPipeline", "register_pipeline", "ImagePipeline", "TokenImagePipeline", "LlamaGenPipeline",
           "AnyOrderPipeline", "ContinuousARPipeline", "MARPipeline", "UnifiedARPipeline", "VisualSpecImageOutput", "NextFramePipeline",
           "VisualSpecVideoOutput", "export_video"]
