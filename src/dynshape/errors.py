"""Error classes. Every failure dynshape reports on bad input is one of these, never a deep traceback."""


class DynshapeError(Exception):
    """Base of every error dynshape raises on purpose."""


class ShapeError(DynshapeError):
    """A symbolic fact is malformed, undecidable where a decision was required, or contradicts another."""


class ConstraintViolation(DynshapeError):
    """Concrete inputs break the model's signature (rank, dtype, range, divisibility, agreement)."""


class ModelError(DynshapeError):
    """A model cannot be read: malformed file, cycle, dangling input, bad attribute, unsupported op."""
