"""``tdu index SHARD.tar [OUT.idx]``, run as a subprocess like a user would."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from torch_dataloader_utils.cli import main
from torch_dataloader_utils.webdataset import build_index, format_index

pytestmark = pytest.mark.timeout(120)


def tdu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch_dataloader_utils", "index", *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def write_shard(path: Path, n: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for i in range(n):
            for ext, body in (("jpg", b"j" * (i * 100)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(body)
                tf.addfile(info, io.BytesIO(body))
    path.write_bytes(out.getvalue())
    return out.getvalue()


def expected_index(data: bytes) -> str:
    return format_index(build_index(lambda o, n: data[o : o + n], len(data), where="x"))


def test_index_writes_the_sibling_and_a_named_output(tmp_path: Path) -> None:
    shard = tmp_path / "train-000.tar"
    data = write_shard(shard, 12)
    done = tdu(str(shard))
    assert done.returncode == 0, done.stderr
    sibling = tmp_path / "train-000.idx"
    assert sibling.read_text() == expected_index(data)
    assert sibling.read_text().startswith("v1.2 12\njpg 512 0 s000.jpg cls 1024 1 s000.cls\n")
    assert f"{sibling}: 12 samples" in done.stdout
    out = tmp_path / "elsewhere" / "x.idx"
    out.parent.mkdir()
    assert main(["index", str(shard), str(out)]) == 0  # in process: a subprocess costs seconds
    assert out.read_bytes() == sibling.read_bytes()


def test_index_of_a_truncated_shard_fails_naming_shard_and_offset(tmp_path: Path) -> None:
    shard = tmp_path / "bad.tar"
    data = write_shard(shard, 5)
    shard.write_bytes(data[:3000])
    done = tdu(str(shard))
    assert done.returncode != 0
    assert f"{shard}: offset 2560: truncated header: 440 bytes" in done.stderr
    assert not (tmp_path / "bad.idx").exists()
    assert "Traceback" not in done.stderr


def test_index_of_an_empty_shard(tmp_path: Path) -> None:
    shard = tmp_path / "empty.tar"
    write_shard(shard, 0)
    assert main(["index", str(shard)]) == 0
    assert (tmp_path / "empty.idx").read_text() == "v1.2 0\n"


def test_index_of_a_corrupt_shard_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = tmp_path / "bad.tar"
    data = bytearray(write_shard(shard, 3))
    data[1536 + 10] ^= 1  # the third header (s000.jpg is empty: headers at 0, 512, 1536)
    shard.write_bytes(bytes(data))
    assert main(["index", str(shard)]) == 2
    assert f"{shard}: offset 1536: bad header checksum" in capsys.readouterr().err
    assert not (tmp_path / "bad.idx").exists()
