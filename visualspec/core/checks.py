"""Argument checks shared by every layer: one wording for one mistake."""

from __future__ import annotations


def is_int(value) -> bool:
    """True for a Python or NumPy integer, False for a bool (``True`` is not a count)."""
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value, low: int | None = 1, *, optional: bool = False, high: int | None = None):
    """``value`` if it is an integer with ``low <= value`` (and ``value <= high``), else a
    ValueError naming ``name``: ``"batch_size must be an integer >= 1, got 0"``. ``low=None``:
    any integer; ``optional``: None passes (and is returned)."""
    if optional and value is None:
        return value
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        bound = (f" in [{low}, {high}]" if low is not None and high is not None
                 else f" >= {low}" if low is not None else f" <= {high}" if high is not None else "")
        raise ValueError(f"{name} must be an integer{bound}{' or None' if optional else ''}, got {value!r}")
    return value


def check_positive_int(name: str, value, *, optional: bool = False):
    """``value`` if it is an integer >= 1 (None too when ``optional``), else a ValueError naming
    ``name`` (see :func:`check_int`)."""
    return check_int(name, value, 1, optional=optional)


def check_probability(name: str, value) -> float:
    """``value`` as a float in [0, 1] (a probability, a threshold on one), else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
