"""Reading image files: the one check, shared by the scorers and by batch's resume, that a file is
a whole image."""

from __future__ import annotations


def read_image(path):
    """The image in file ``path`` as a PIL image in its own mode, decoded in full here (so a
    truncated file fails now, not half way through scoring). A file that is not a whole image
    (truncated, empty, not an image, missing) raises ValueError naming it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            return im
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError...
        raise ValueError(f"could not read image file {path}: {type(e).__name__}: {e}") from e
