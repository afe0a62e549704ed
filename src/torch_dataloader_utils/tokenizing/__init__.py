"""Raw text in: the rows a transform yields and the tokens a tokenizer gives them, computed in
the loader (`Tokenize`, `Transform`, applied to a chunk's rows by `Derivation`); planning counts
them once (the census, `sources.census`). docs/concepts/census.md, docs/adr/0030."""

from .derive import Derivation
from .encoders import encoder_of
from .options import Tokenize, Transform

__all__ = ["Derivation", "Tokenize", "Transform", "encoder_of"]
