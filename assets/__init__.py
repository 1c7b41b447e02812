"""The shipped models, installed with the package as ``visualspec.assets`` (package data), so a
wheel or a plain ``pip install .`` finds them as an editable checkout does. Each folder holds one
model and its card (``README.md``)."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent
SHAPES_T2I = ASSETS / "shapes-t2i"  # the default text-to-image pipeline (shapes world)
SHAPES_ANY_ORDER = ASSETS / "shapes-any-order"  # the any-order shapes model (ASSD, infilling; #52)
SHAPES_LUMINA = ASSETS / "shapes-lumina"  # a Lumina-layout model of the shapes world (transformers' Chameleon)
SHAPES_FID = ASSETS / "shapes-fid"  # the FID-shapes feature network and its reference statistics
ARENA_NFD = ASSETS / "arena-nfd"  # the arena world model (next-frame video pipeline)
TEXT_PAIR = ASSETS / "text-pair"  # a trained target and draft language model for text decoding
