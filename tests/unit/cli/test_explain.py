"""``tdu explain`` (`cli.explain`): a batch is needed, and a state it cannot describe (other data,
a junk or broken file, a packed mixture's) is refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_parquet
from tests.unit.cli.commands import assert_one_line, tdu
from torch_dataloader_utils.cli import parser

pytestmark = pytest.mark.timeout(60)


def test_explain_needs_a_batch() -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["explain", "data/"])
    assert info.value.code == 2
    args = parser().parse_args(["explain", "data/", "--batch", "3"])
    assert args.batch == 3


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Path]:
    """Data, and a state saved after 3 batches of it."""
    import itertools
    import json

    import torch_dataloader_utils as lib

    data = tmp_path / "data"
    write_parquet(data / "a.parquet", np.arange(300))
    loader = lib.create_dataloader(str(data), batch_size=8, shuffle=True, num_workers=0)
    list(itertools.islice(loader, 3))
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    return data, state


def test_explain_refuses_a_state_of_other_data(saved: tuple[Path, Path], tmp_path: Path) -> None:
    data, state = saved
    other = tmp_path / "other"
    write_parquet(other / "b.parquet", np.arange(1000, 1500))
    done = tdu("explain", str(other), "--batch", "1", "--state", str(state))
    assert_one_line(done, "explain", str(state), "rows: 300 then, 500 now", "mixture")
    assert "allow_changed_data" not in done.stderr  # (a load_state_dict keyword, not a flag)
    done = tdu("explain", str(data), "--batch", "1", "--state", str(state), "--limit", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("epoch 0, rank 0 of 1, 1 worker, batch 1: 8 rows")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"a": 1}', "holds no loader state (found: a)"),
        (b"[1, 2]", "holds no loader state"),
        (b"{not json", "not JSON (Expecting property name"),
        (b"\x00\x01 junk bytes", "neither JSON nor a torch.save file"),
        (b"", "neither JSON nor a torch.save file"),
    ],
)
def test_explain_names_a_junk_state_file(
    saved: tuple[Path, Path], tmp_path: Path, content: bytes, needle: str
) -> None:
    data, _ = saved
    junk = tmp_path / "junk.pt"
    junk.write_bytes(content)
    done = tdu("explain", str(data), "--batch", "1", "--state", str(junk))
    assert_one_line(done, "explain", str(junk), needle)


@pytest.mark.parametrize("drop", ["layout", "topology", "plan"])
def test_explain_names_what_a_broken_state_lacks(
    saved: tuple[Path, Path], tmp_path: Path, drop: str
) -> None:
    import json

    data, state = saved
    broken = json.loads(state.read_text())
    if drop == "layout":
        broken["layout"] = {"batch_size": 8}
    else:
        del broken[drop]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    done = tdu("explain", str(data), "--batch", "1", "--state", str(path))
    assert_one_line(done, "explain", str(path), "malformed loader state")


def test_explain_refuses_a_packed_mixtures_state(tmp_path: Path) -> None:
    """The state of packed sequences needs --packing; a mixture's does not fit one path."""
    import itertools
    import json

    import torch_dataloader_utils as lib

    roots = []
    for s in range(2):
        root = tmp_path / f"source-{s}"
        root.mkdir()
        tokens = [[s * 1000 + r * 10 + p for p in range(1 + r % 7)] for r in range(80)]
        pq.write_table(pa.table({"tokens": pa.array(tokens, pa.list_(pa.int64()))}), root / "a.pq")
        roots.append(root)
    loader = lib.create_dataloader(
        [lib.Source(str(r)) for r in roots],
        packing=lib.Packing("tokens", seq_len=8),
        batch_size=2,
        shuffle=True,
        num_workers=0,
    )
    list(itertools.islice(loader, 2))
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    done = tdu("explain", str(roots[0]), "--batch", "1", "--state", str(state))
    assert_one_line(done, "explain", str(state), "packed sequences", "--packing COLUMN")
    done = tdu(
        "explain", str(roots[0]), "--batch", "1", "--state", str(state), "--packing", "tokens"
    )
    assert_one_line(done, "explain", str(state), "does not fit", "rows: ", "a mixture")
