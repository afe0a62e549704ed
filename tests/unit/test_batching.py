"""How rows become batches of tokens (`Packing`, `TokenBudget`): each refuses what is out of range
when made, and a batch's tokens follow from its options."""

from __future__ import annotations

from typing import Any

import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.batching import Packing, TokenBudget
from torch_dataloader_utils.options import Options


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Packing("tokens", seq_len=0), "seq_len must be a positive integer"),
        (lambda: Packing("", seq_len=8), "column must be a name"),
        (lambda: Packing("tokens", seq_len=8, method="greedy"), "method must be one of"),
        (lambda: Packing("tokens", seq_len=8, pad_value=0.5), "pad_value must be an int"),  # type: ignore[arg-type]
        (lambda: Packing("tokens", seq_len=8, fill=0), r"fill must be in \(0, 1\]"),
        (lambda: Packing("tokens", seq_len=8, fill=1.01), r"fill must be in \(0, 1\]"),
        (lambda: Packing("tokens", seq_len=8, fill=float("nan")), r"fill must be in"),
        (lambda: Packing("tokens", seq_len=8, fill=True), "fill must be a number"),
        (lambda: Packing("tokens", seq_len=8, fill="0.9"), "fill must be a number"),  # type: ignore[arg-type]
        (
            lambda: Options(batch_size=1, packing=Packing("t", 4, method="best_fit", fill=0.1)),
            "fill leaves a batch no token",
        ),
        (lambda: TokenBudget("tokens", max_tokens=0), "max_tokens must be a positive integer"),
        (lambda: TokenBudget("tokens", 64, overflow="drop"), 'overflow must be "error"'),
        (
            lambda: Options(batch_size=8, batching=TokenBudget("tokens", 64)),
            "batch_size=8 with batching=TokenBudget.*the token budget replaces batch_size",
        ),
        (
            lambda: Packing("t", 8).check_columns(["t", "id"], source_column=None),
            r"cannot carry 'id'; it yields only input_ids, .*max_seqlen, made from the column 't'",
        ),
    ],
)
def test_packing_and_token_budgets_refuse_what_is_out_of_range(make: Any, message: str) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match=message):
        make()


def test_a_best_fit_batch_takes_its_fill_of_the_slots_in_tokens() -> None:
    def rows(**packing: Any) -> int:
        return Options(batch_size=8, packing=Packing("t", seq_len=2048, **packing)).batch_rows

    assert rows() == rows(fill=0.5) == 8 * 2048  # concat: every slot
    # Whole sequences' shares (a packed mixture gives a source that many tokens at a time).
    assert rows(method="best_fit") == 8 * 1945  # 8 * floor(2,048 * 0.95)
    assert rows(method="best_fit", fill=1) == 8 * 2048
    assert Packing("t", seq_len=100, method="best_fit", fill=0.29).batch_tokens(1) == 29


def test_a_token_budget_takes_the_default_batch_size_and_packing_its_own_column() -> None:
    assert Options(batching=TokenBudget("tokens", 64)).batching is not None
    Packing("t", 8).check_columns(None, source_column=None)
    Packing("t", 8).check_columns(["t"], source_column="src")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tdu.Balance(window=0), "window must be a positive integer"),
        (lambda: tdu.Balance(cost="flops"), "cost must be one of"),
        (lambda: tdu.Balance(linear=-1.0), "linear must be finite and >= 0"),
        (lambda: tdu.Balance(linear=float("inf")), "linear must be finite"),
        (lambda: tdu.Balance(linear="5"), "linear must be a number"),  # type: ignore[arg-type]
        (lambda: Packing("t", 8, balance=64), "balance must be a tdu.Balance"),  # type: ignore[arg-type]
        (lambda: TokenBudget("t", 8, balance="yes"), "balance must be a tdu.Balance"),  # type: ignore[arg-type]
        (lambda: tdu.Balance(windw=8), "did you mean 'window'"),  # type: ignore[call-arg]
    ],
)
def test_a_balance_refuses_what_is_out_of_range(make: Any, message: str) -> None:
    with pytest.raises(tdu.TorchDataloaderUtilsError, match=message):
        make()


def test_a_balances_identity_names_its_cost() -> None:
    def flops(lengths: Any) -> float:
        return float(lengths.sum())

    assert tdu.Balance(window=8, cost=flops, linear=3).identity() == {
        "window": 8,
        "cost": f"{__name__}.test_a_balances_identity_names_its_cost.<locals>.flops",
        "linear": 3.0,
    }
    assert tdu.Balance().identity() == {"window": 64, "cost": "attention", "linear": 0.0}
