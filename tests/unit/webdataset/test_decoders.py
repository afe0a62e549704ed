"""Component decoders: what each extension becomes, safe by default, and clear failures."""

from __future__ import annotations

import builtins
import io
import json
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from torch_dataloader_utils.errors import (
    CorruptFileError,
    InvalidArgumentError,
    MissingDependencyError,
)
from torch_dataloader_utils.webdataset.decoders import (
    DecodeOptions,
    decode_ints,
    decode_text,
    decoder_for,
    storage_of,
)


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def png_bytes(array: np.ndarray, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.fromarray(array, mode=mode).save(out, format="PNG")
    return out.getvalue()


def upper(value: bytes) -> bytes:
    return value.upper()


class Evil:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (builtins.print, ("unpickled!",))


def test_storage_by_last_extension_part() -> None:
    safe = DecodeOptions()
    assert storage_of("cls", safe) == "int"
    assert storage_of("seg.cls2", safe) == "int"
    assert storage_of("id", safe) == "int"
    assert storage_of("txt", safe) == "text"
    assert storage_of("json", safe) == "binary"
    assert storage_of("jpg", safe) == "binary"
    raw = DecodeOptions(decode=False)
    assert {storage_of(e, raw) for e in ("cls", "txt", "json")} == {"binary"}
    assert storage_of("cls", DecodeOptions(custom={"cls": upper})) == "binary"


def test_ints_in_bulk_and_webdatasets_forms() -> None:
    values = pa.array([b"3", b" 12\n", None, b"-4"], pa.binary())
    assert decode_ints(values).to_pylist() == [3, 12, None, -4]
    # Arrow's parser refuses "+5"; Python's int(), webdataset's rule, takes it.
    assert decode_ints(pa.array([b"+5", b"7"], pa.binary())).to_pylist() == [5, 7]
    with pytest.raises(ValueError) as info:
        decode_ints(pa.array([b"1", b"2", b"cat"], pa.binary()))
    assert info.value.args[1] == 2 and "b'cat' is not an integer" in info.value.args[0]


def test_text_is_utf8_checked() -> None:
    assert decode_text(pa.array(["héllo".encode(), b""], pa.binary())).to_pylist() == [
        "héllo",
        "",
    ]
    with pytest.raises(ValueError) as info:
        decode_text(pa.array([b"ok", b"\xff\xfe"], pa.binary()))
    assert info.value.args[1] == 1


def test_json_npy_npz() -> None:
    safe = DecodeOptions()
    decode = decoder_for("json", safe)
    assert decode is not None and decode(json.dumps({"a": [1, 2]}).encode()) == {"a": [1, 2]}
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = decoder_for("npy", safe)(npy_bytes(array))  # type: ignore[misc]
    assert got.dtype == np.float32 and np.array_equal(got, array)
    out = io.BytesIO()
    np.savez(out, x=array, y=np.arange(3))
    both = decoder_for("npz", safe)(out.getvalue())  # type: ignore[misc]
    assert set(both) == {"x", "y"} and np.array_equal(both["x"], array)


def test_npy_of_objects_is_refused() -> None:
    objects = npy_bytes(np.array([{"a": 1}], dtype=object))
    with pytest.raises(CorruptFileError, match=r"cannot decode a 'npy' component.*pickle"):
        decoder_for("npy", DecodeOptions())(objects)  # type: ignore[misc]


def test_bad_values_raise_corrupt_file_error() -> None:
    with pytest.raises(CorruptFileError, match=r"'json' component \(5 bytes, starting b'\{nope'"):
        decoder_for("json", DecodeOptions())(b"{nope")  # type: ignore[misc]
    with pytest.raises(CorruptFileError, match=r"'npy' component"):
        decoder_for("npy", DecodeOptions())(b"\x93NUMPY broken")  # type: ignore[misc]
    images = DecodeOptions(decode_images=True)
    with pytest.raises(CorruptFileError, match=r"'png' component"):
        decoder_for("png", images)(b"not a png at all")  # type: ignore[misc]


def test_empty_values_decode_to_none() -> None:
    for ext in ("json", "npy"):
        assert decoder_for(ext, DecodeOptions())(b"") is None  # type: ignore[misc]


def test_images_only_when_asked() -> None:
    pixels = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    data = png_bytes(pixels)
    assert decoder_for("png", DecodeOptions()) is None  # bytes by default
    decode = decoder_for("png", DecodeOptions(decode_images=True))
    assert decode is not None
    got = decode(data)
    assert got.dtype == np.uint8 and got.shape == (4, 5, 3) and np.array_equal(got, pixels)
    gray = decode(png_bytes(pixels[..., 0], mode="L"))
    assert gray.shape == (4, 5, 3)  # always RGB


def test_missing_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pil(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(MissingDependencyError, match=r"torch-dataloader-utils\[images\]"):
        DecodeOptions(decode_images=True)


def test_pickle_and_torch_only_with_allow_pickle(capsys: pytest.CaptureFixture[str]) -> None:
    data = pickle.dumps(Evil())
    for ext in ("pyd", "pickle", "pth"):
        assert decoder_for(ext, DecodeOptions()) is None  # stays bytes: nothing runs
    assert "unpickled!" not in capsys.readouterr().out
    trusted = DecodeOptions(allow_pickle=True)
    assert decoder_for("pyd", trusted)(pickle.dumps({"a": 1})) == {"a": 1}  # type: ignore[misc]
    decoder_for("pickle", trusted)(data)  # type: ignore[misc]
    assert "unpickled!" in capsys.readouterr().out  # the opt-in is real: code ran
    out = io.BytesIO()
    torch.save(torch.arange(3), out)
    got = decoder_for("pth", trusted)(out.getvalue())  # type: ignore[misc]
    assert torch.equal(got, torch.arange(3))


def test_decode_false_keeps_bytes() -> None:
    raw = DecodeOptions(decode=False, decode_images=True, allow_pickle=True)
    assert all(decoder_for(e, raw) is None for e in ("json", "npy", "png", "pyd", "pth"))


def test_custom_decoders_win_and_must_pickle() -> None:
    options = DecodeOptions(custom={"json": upper, "seg.bin": upper})
    assert decoder_for("json", options) is upper
    assert decoder_for("seg.bin", options) is upper
    assert decoder_for("x.json", options) is upper  # by its last part
    with pytest.raises(InvalidArgumentError, match="does not pickle"):
        DecodeOptions(custom={"bin": lambda b: b})
    with pytest.raises(InvalidArgumentError, match="map extensions"):
        DecodeOptions(custom={"bin": 3})  # type: ignore[dict-item]


def test_decoders_pickle() -> None:
    for ext in ("json", "npy", "png"):
        decode = decoder_for(ext, DecodeOptions(decode_images=True))
        clone = pickle.loads(pickle.dumps(decode))
        assert clone == decode
