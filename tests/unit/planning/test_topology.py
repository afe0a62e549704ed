"""Where a reader sits: Topology and resolve_rank."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch.distributed as dist

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import Topology, resolve_rank

# --- Topology ---------------------------------------------------------------------------------


def test_topology_accepts_exactly_the_valid_positions():
    for rank, world_size, worker, num_workers in itertools.product(range(-1, 5), repeat=4):
        valid = 0 <= rank < world_size and 0 <= worker < num_workers
        if valid:
            topo = Topology(rank, world_size, worker, num_workers)
            assert (topo.rank, topo.world_size, topo.worker, topo.num_workers) == (
                rank,
                world_size,
                worker,
                num_workers,
            )
        else:
            with pytest.raises(InvalidArgumentError) as info:
                Topology(rank, world_size, worker, num_workers)
            assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rank": 2, "world_size": 2}, ("2",)),
        ({"rank": -1, "world_size": 4}, ("-1", "4")),
        ({"worker": 3, "num_workers": 3}, ("3",)),
        ({"worker": 0, "num_workers": 0}, ("0",)),
    ],
)
def test_topology_errors_name_the_bad_values(kwargs, words):
    with pytest.raises(InvalidArgumentError) as info:
        Topology(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_topology_default_is_a_single_stream():
    topo = Topology()
    assert (topo.rank, topo.world_size, topo.worker, topo.num_workers) == (0, 1, 0, 1)
    assert topo.stream == 0
    assert topo.num_streams == 1


def test_streams_number_every_rank_and_worker_once_rank_major():
    for world_size, num_workers in itertools.product(range(1, 6), range(1, 6)):
        topologies = [
            Topology(rank, world_size, worker, num_workers)
            for rank, worker in itertools.product(range(world_size), range(num_workers))
        ]  # rank-major order
        assert [t.stream for t in topologies] == list(range(world_size * num_workers))
        assert {t.num_streams for t in topologies} == {world_size * num_workers}


def test_topology_is_frozen_and_hashable():
    topo = Topology(1, 2, 0, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.rank = 0  # type: ignore[misc]
    assert topo == Topology(1, 2, 0, 3)
    assert len({topo, Topology(1, 2, 0, 3), Topology(1, 2, 1, 3)}) == 2


def test_with_worker_in_the_main_process_is_worker_zero_of_one():
    # Outside a DataLoader worker the process reads alone, whatever the constructor assumed.
    topo = Topology(rank=1, world_size=3, worker=2, num_workers=4)
    assert topo.with_worker() == Topology(1, 3, 0, 1)


# --- resolve_rank -----------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    # No test initialises a process group in the pytest process (ranks run in subprocesses);
    # one here would make resolve_rank ignore the environment these tests set.
    assert not (dist.is_available() and dist.is_initialized())
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return monkeypatch


def test_resolve_rank_defaults_to_a_single_rank(clean_env):
    assert resolve_rank() == (0, 1)


def test_resolve_rank_reads_the_torchrun_environment(clean_env):
    clean_env.setenv("RANK", "2")
    clean_env.setenv("WORLD_SIZE", "4")
    assert resolve_rank() == (2, 4)
    assert all(type(v) is int for v in resolve_rank())


@pytest.mark.parametrize(("name", "value"), [("WORLD_SIZE", "3"), ("RANK", "1")])
def test_resolve_rank_with_half_the_environment_is_an_error(clean_env, name, value):
    # Every process would otherwise be rank 0 of its own world and read the same rows.
    clean_env.setenv(name, value)
    with pytest.raises(InvalidArgumentError, match="RANK"):
        resolve_rank()


@pytest.mark.parametrize(("rank", "world"), [("x", "2"), ("3", "2"), ("0", "0")])
def test_resolve_rank_rejects_a_bad_environment(clean_env, rank, world):
    clean_env.setenv("RANK", rank)
    clean_env.setenv("WORLD_SIZE", world)
    with pytest.raises(InvalidArgumentError):
        resolve_rank()


@pytest.mark.parametrize(("rank", "world_size"), [(1, 3), (0, 1), (5, 8)])
def test_explicit_rank_wins_over_the_environment(clean_env, rank, world_size):
    clean_env.setenv("RANK", "2")
    clean_env.setenv("WORLD_SIZE", "4")
    assert resolve_rank(rank, world_size) == (rank, world_size)
    assert resolve_rank(rank=rank, world_size=world_size) == (rank, world_size)


@pytest.mark.parametrize("with_env", [False, True])
@pytest.mark.parametrize(
    "kwargs", [{"rank": 0}, {"world_size": 2}, {"rank": 1, "world_size": None}]
)
def test_resolve_rank_needs_both_or_neither(clean_env, with_env, kwargs):
    if with_env:
        clean_env.setenv("RANK", "1")
        clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(InvalidArgumentError) as info:
        resolve_rank(**kwargs)
    assert isinstance(info.value, ValueError)
