"""The census spread over the ranks: each rank tokenizes a share of the chunks at planning,
kept in a shared ``census_dir`` that a restarted job (on fresh ``cache_dir``s) reads instead.

Spec: ``out``, ``data``, ``tokenizer`` (its JSON file), ``cases``: ``{name, cache_dir,
census_dir}`` read in order. For each case and rank the result holds the texts this rank
tokenized at planning, the plan's fingerprint and the tokens of one shuffled epoch (2 workers),
padding left out.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from tokenizers import Tokenizer

import torch_dataloader_utils as tdu
from tests.distributed.scripts.ranks import gather, join, leave, spec, watchdog, write

TEXTS = [0]  # texts tokenized in this process


def main() -> None:
    job = spec()
    join()
    tokenizer = Tokenizer.from_file(job["tokenizer"])

    def words(texts: list[str]) -> list[list[int]]:
        TEXTS[0] += len(texts)
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    results = {}
    for case in job["cases"]:
        dist.barrier()
        TEXTS[0] = 0
        loader = tdu.create_dataloader(
            job["data"],
            tokenize=tdu.Tokenize("text", words, fingerprint="words-v1"),
            packing=tdu.Packing("tokens", 8, pad_value=-1),
            batch_size=3,
            shuffle=True,
            null_policy="fill",
            remainder="pad",
            num_workers=2,
            worker_init_fn=watchdog,
            cache_dir=case["cache_dir"],
            census_dir=case["census_dir"],
        )
        planned = TEXTS[0]
        tokens = [
            [t for t in batch["input_ids"].reshape(-1).tolist() if t >= 0] for batch in loader
        ]
        result: dict[str, Any] = {
            "planned": planned,
            "fingerprint": loader.dataset.plan.fingerprint,
            "tokens": tokens,
        }
        results[case["name"]] = gather(result)
    write(job["out"], results)
    leave()


if __name__ == "__main__":
    main()
