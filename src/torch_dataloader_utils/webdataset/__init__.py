"""WebDataset tar shards: tar scanning, webdataset's sample grouping, DALI's index, a shard
writer, and the format that reads shards through their indexes (`format.WebDatasetFormat`).

Needs neither torch nor webdataset. Importing this package leaves the format out (the format
registry imports `format` when ``"webdataset"`` is first asked for).
"""

from __future__ import annotations

from .index import ShardIndex, build_index, format_index, index_path, parse_index
from .loading import default_cache_dir, load_index
from .samples import Component, Sample, group_samples, split_name
from .tar import TarMember, scan_tar
from .writer import ShardWriter

__all__ = [
    "Component",
    "Sample",
    "ShardIndex",
    "ShardWriter",
    "TarMember",
    "build_index",
    "default_cache_dir",
    "format_index",
    "group_samples",
    "index_path",
    "load_index",
    "parse_index",
    "scan_tar",
    "split_name",
]
