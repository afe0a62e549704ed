"""Decoding WebDataset components, safe by default.

Each component is decoded by the last part of its extension (``seg.png`` is a ``png``), as
webdataset does. Two kinds are decoded inside Arrow while the batch is read, in bulk:

- integers (``cls``, ``cls2``, ``class``, ``count``, ``index``, ``inx``, ``id``): ``int64``;
- text (``txt``, ``text``, ``transcript``): UTF-8 ``string``.

The others stay binary in Arrow and are decoded per value in the worker after conversion
(`decoders`): ``json``/``jsn`` (Python objects), ``npy`` (a numpy array, ``allow_pickle=False``),
``npz`` (a dict of arrays, likewise), images (``jpg`` ``png`` ``webp`` ... as ``uint8`` HWC RGB
arrays, only with ``decode_images=True``; needs Pillow), ``pyd``/``pickle`` (``pickle.loads``)
and ``pth`` (``torch.load``) only with ``allow_pickle=True``: unpickling runs code the file's
author chose, so without the opt-in they stay bytes. Everything else stays bytes.

A zero-byte value (a missing component under ``missing_component="empty"``) decodes to
``None``; a zero-byte integer component is null in Arrow.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptFileError, InvalidArgumentError, MissingDependencyError

__all__ = [
    "IMAGE_EXTENSIONS",
    "INT_EXTENSIONS",
    "TEXT_EXTENSIONS",
    "Column",
    "Decoder",
    "DecodeOptions",
    "Storage",
    "column_of",
    "decode_ints",
    "decode_text",
    "decoder_for",
    "storage_of",
]

Decoder = Callable[[Any], Any]
Storage = Literal["int", "text", "binary"]

INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "webp", "tif", "tiff", "gif"}
)
PICKLE_EXTENSIONS = frozenset({"pyd", "pickle"})
TORCH_EXTENSIONS = frozenset({"pth"})

_ARROW_TYPES: dict[Storage, pa.DataType] = {
    "int": pa.int64(),
    "text": pa.string(),
    "binary": pa.binary(),
}


def _last(ext: str) -> str:
    return ext.rsplit(".", 1)[-1].lower()


@dataclass(frozen=True)
class DecodeOptions:
    """How components are decoded (see the module docstring).

    Attributes:
        decode: ``False`` keeps every component as bytes (``__key__``/``__url__`` stay strings).
        decode_images: decode images to ``uint8`` HWC RGB numpy arrays (needs Pillow).
        allow_pickle: decode ``pyd``/``pickle`` with `pickle.loads` and ``pth`` with
            `torch.load`: both run arbitrary code from the data; only for data you trust.
        custom: ``{extension: function(bytes) -> value}``, taking precedence over the built-in
            decoders; matched on the whole extension first, then its last part. The functions
            must pickle (workers receive them).
    """

    decode: bool = True
    decode_images: bool = False
    allow_pickle: bool = False
    custom: Mapping[str, Decoder] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for ext, fn in self.custom.items():
            if not isinstance(ext, str) or not callable(fn):
                raise InvalidArgumentError(
                    f"decoders must map extensions (str) to functions, got {ext!r}: {fn!r}"
                )
            try:
                pickle.dumps(fn)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                raise InvalidArgumentError(
                    f"the decoder of {ext!r} does not pickle ({exc}); DataLoader workers "
                    "receive it pickled: use a module-level function, not a lambda or closure"
                ) from exc
        if self.decode_images:
            _pillow()  # fail now, in the main process, not in a worker

    def _custom(self, ext: str) -> Decoder | None:
        found = self.custom.get(ext)
        return found if found is not None else self.custom.get(_last(ext))


def storage_of(ext: str, options: DecodeOptions) -> Storage:
    """How a component of extension ``ext`` is held in Arrow."""
    if not options.decode or options._custom(ext) is not None:
        return "binary"
    last = _last(ext)
    if last in INT_EXTENSIONS:
        return "int"
    if last in TEXT_EXTENSIONS:
        return "text"
    return "binary"


def arrow_type(storage: Storage) -> pa.DataType:
    """The Arrow type of a column held as ``storage``."""
    return _ARROW_TYPES[storage]


@dataclass(frozen=True)
class Column:
    """A requested column of the WebDataset format.

    Attributes:
        name: as requested (``"jpg;png"``).
        alternatives: its extensions, the first present wins (``()``: ``__key__``/``__url__``).
        storage: how its values are held in Arrow.
    """

    name: str
    alternatives: tuple[str, ...]
    storage: Storage


def column_of(name: str, options: DecodeOptions, *, case_sensitive: bool) -> Column:
    """The column ``name`` (``"__key__"``, ``"__url__"``, an extension, or alternatives
    separated by ``;``).

    Raises:
        InvalidArgumentError: an empty alternative, or alternatives that decode differently.
    """
    if name in ("__key__", "__url__"):
        return Column(name, (), "text")
    parts = (e.strip() for e in name.split(";"))
    alternatives = tuple(dict.fromkeys(e if case_sensitive else e.lower() for e in parts))
    if not all(alternatives):
        raise InvalidArgumentError(f"column {name!r}: an empty extension between ';'")
    kinds = {storage_of(e, options) for e in alternatives}
    # Built-in decoders differ only in the extension named in errors: compare what they run.
    decoders = {getattr(d, "decode", d) for d in (decoder_for(e, options) for e in alternatives)}
    if len(kinds) > 1 or len(decoders) > 1:
        raise InvalidArgumentError(
            f"column {name!r}: its alternatives decode differently; list alternatives of "
            "one kind (e.g. 'jpg;png'), or pass decode=False"
        )
    return Column(name, alternatives, kinds.pop())


def decoder_for(ext: str, options: DecodeOptions) -> Decoder | None:
    """The per-value decoder of extension ``ext`` (``None``: the value stays as read)."""
    if not options.decode:
        return None
    custom = options._custom(ext)
    if custom is not None:
        return custom
    last = _last(ext)
    if last in JSON_EXTENSIONS:
        return _Checked(last, _json)
    if last == "npy":
        return _Checked(last, _npy)
    if last == "npz":
        return _Checked(last, _npz)
    if options.decode_images and last in IMAGE_EXTENSIONS:
        return _Checked(last, _image)
    if options.allow_pickle and last in PICKLE_EXTENSIONS:
        return _Checked(last, pickle.loads)
    if options.allow_pickle and last in TORCH_EXTENSIONS:
        return _Checked(last, _torch)
    return None


@dataclass(frozen=True)
class _Checked:
    """A built-in decoder whose failures are `CorruptFileError` naming the extension; a
    zero-byte value (a missing component kept empty) is ``None``."""

    ext: str
    decode: Decoder

    def __call__(self, value: Any) -> Any:
        if value is None or len(value) == 0:
            return None
        try:
            return self.decode(value)
        # What the built-in decoders raise on bad bytes (Pillow's UnidentifiedImageError is an
        # OSError; pickle raises UnpicklingError, EOFError or nearly anything, but only runs
        # with the user's explicit opt-in).
        except (ValueError, TypeError, OSError, EOFError, KeyError, pickle.UnpicklingError) as exc:
            head = bytes(value[:16])
            raise CorruptFileError(
                f"cannot decode a {self.ext!r} component ({len(value)} bytes, starting "
                f"{head!r}): {exc}"
            ) from exc


def _json(value: bytes) -> Any:
    return json.loads(value)


def _npy(value: bytes) -> np.ndarray:
    return np.load(io.BytesIO(value), allow_pickle=False)  # type: ignore[no-any-return]


def _npz(value: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(value), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError(
            "decode_images=True needs Pillow: pip install torch-dataloader-utils[images]"
        ) from exc
    return Image


def _image(value: bytes) -> np.ndarray:
    image = _pillow()
    with image.open(io.BytesIO(value)) as img:
        return np.asarray(img.convert("RGB"))


def _torch(value: bytes) -> Any:
    import torch

    # weights_only=False: the user opted in to arbitrary objects (allow_pickle=True).
    return torch.load(io.BytesIO(value), map_location="cpu", weights_only=False)


def decode_ints(values: pa.Array) -> pa.Array:
    """Binary integer components (``b"3"``, ``b" 12\\n"``) as ``int64``; nulls stay null.

    Raises:
        ValueError: a value is not an integer; ``args[1]`` is its position.
    """
    try:
        return pc.cast(pc.utf8_trim_whitespace(values.cast(pa.string())), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    # Rare forms Arrow's parser refuses but Python's int() (webdataset's rule) accepts ("+3",
    # "1_000"), or the bad value to name.
    out: list[int | None] = []
    for i, value in enumerate(values.to_pylist()):
        try:
            out.append(None if value is None else int(value))
        except ValueError as exc:
            raise ValueError(f"{bytes(value[:32])!r} is not an integer", i) from exc
    return pa.array(out, pa.int64())


def decode_text(values: pa.Array) -> pa.Array:
    """Binary text components as UTF-8 strings.

    Raises:
        ValueError: a value is not valid UTF-8; ``args[1]`` is its position.
    """
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    out: list[str | None] = []
    for i, value in enumerate(values.to_pylist()):
        try:
            out.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 text ({exc})", i) from exc
    return pa.array(out, pa.string())
