"""The package's shape stays readable: few top-level modules, small modules, short functions,
and each module's tests found by its path.

A module over `MODULE_LINES` is allowed only in `LARGE`, with its reason; the top level holds at
most `TOP_LEVEL` modules (the façade: the rest lives in the layers' subpackages). Module
``<path>/<name>.py`` is tested in ``tests/unit/<path>/test_<name>.py``, or `TESTED_IN` says where.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "src" / "torch_dataloader_utils"
UNIT = REPO / "tests" / "unit"

TOP_LEVEL = 7
MODULE_LINES = 450
FUNCTION_LINES = 120
# Modules allowed over MODULE_LINES, each with its reason.
LARGE: dict[str, str] = {}


def test_at_most_seven_top_level_modules() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= TOP_LEVEL, top


def test_no_module_over_the_limit_but_the_listed_ones() -> None:
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")
    }
    over = {name for name, lines in sizes.items() if lines > MODULE_LINES}
    assert over <= set(LARGE), {name: sizes[name] for name in over - set(LARGE)}
    assert len(LARGE) <= 2


def test_no_function_over_the_limit() -> None:
    long = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not long, long


# Modules tested in files not named after them: the module (under ROOT) -> the test files
# (paths from the repository's root, comma-separated), most specific first. A module that gets
# its own tests/unit/<path>/test_<name>.py leaves this map.
TESTED_IN: dict[str, str] = {
    "cache/room.py": "tests/unit/cache/test_store.py",
    "cache/stats.py": "tests/unit/cache/test_files.py, tests/unit/cache/test_config.py",
    "create.py": "tests/unit/test_api.py",
    "dataset/balancing.py": "tests/multiproc/test_balance.py",
    "dataset/base.py": "tests/unit/test_dataset.py",
    "dataset/measure.py": "tests/multiproc/test_metrics.py",
    "delta/format.py": (
        "tests/delta/test_tables.py, tests/delta/test_loader.py, tests/delta/test_interop.py"
    ),
    "delta/options.py": "tests/delta/test_tables.py",
    "delta/table.py": "tests/delta/test_tables.py, tests/delta/test_loader.py",
    "dataset/chunk_rows.py": "tests/multiproc/test_rows_at.py, tests/unit/test_dataset.py",
    "dataset/conversion.py": "tests/unit/test_dataset.py, tests/unit/convert/test_decoders.py",
    "dataset/iceberg.py": "tests/iceberg/test_read.py, tests/unit/dataset/test_keywords.py",
    "dataset/lookup.py": "tests/multiproc/test_rows_at.py, tests/unit/test_dataset.py",
    "dataset/mixture.py": "tests/multiproc/test_mixture.py, tests/unit/test_options.py",
    "dataset/packed_lookup.py": "tests/multiproc/test_rows_at.py",
    "dataset/planning.py": "tests/unit/test_dataset.py",
    "dataset/reading.py": ("tests/multiproc/test_tokenize.py, tests/multiproc/test_packing.py"),
    "dataset/structured.py": "tests/unit/test_dataset.py, tests/unit/test_api.py",
    "dataset/tables.py": "tests/iceberg/test_read.py, tests/conformance/test_tables.py",
    "dataset/tokens.py": "tests/multiproc/test_token_budget.py, tests/multiproc/test_packing.py",
    "formats/chunking.py": "tests/unit/formats/test_unit_chunks.py",
    "lance/format.py": "tests/lance/test_conformance.py, tests/lance/test_workers.py",
    "stream/balanced.py": "tests/multiproc/test_balance.py",
    "stream/best_fit_lengths.py": "tests/unit/planning/test_pack_lengths.py",
    "lance/options.py": "tests/lance/test_conformance.py",
    "lance/table.py": "tests/lance/test_conformance.py",
    "fs/hub_listing.py": "tests/unit/fs/test_hub.py, tests/hub/test_read.py",
    "formats/ipc/format.py": (
        "tests/unit/formats/ipc/test_ipc.py, tests/conformance/test_orc_ipc.py"
    ),
    "formats/ipc/messages.py": "tests/unit/formats/ipc/test_ipc.py, tests/corpus/test_fuzz.py",
    "formats/parquet/facts.py": "tests/unit/formats/parquet/test_parquet_footer.py",
    "formats/parquet/footer.py": "tests/unit/formats/parquet/test_parquet_footer.py",
    "formats/parquet/format.py": (
        "tests/unit/formats/parquet/test_parquet.py, tests/conformance/test_parquet.py"
    ),
    "formats/parquet/leafless.py": "tests/unit/formats/parquet/test_parquet_leafless.py",
    "formats/parquet/planning.py": (
        "tests/unit/formats/parquet/test_parquet.py, tests/unit/planning/test_portable_schema.py"
    ),
    "formats/parquet/renaming.py": "tests/unit/formats/parquet/test_parquet_names.py",
    "formats/parquet/thrift.py": "tests/unit/formats/parquet/test_parquet_footer.py",
    "formats/parquet/tokens.py": "tests/unit/sources/test_footer_tokens.py",
    "formats/partitions.py": "tests/unit/test_dataset.py, tests/unit/formats/test_orc.py",
    "formats/schemas.py": "tests/unit/test_dataset.py, tests/unit/stream/test_read.py",
    "formats/text/csv.py": (
        "tests/unit/formats/text/test_text.py, tests/unit/formats/text/test_csv_nulls.py, "
        "tests/unit/formats/text/test_csv_encoding.py"
    ),
    "formats/text/format.py": (
        "tests/unit/formats/text/test_text.py, tests/conformance/test_text.py"
    ),
    "formats/text/json.py": "tests/unit/formats/text/test_text.py, tests/conformance/test_text.py",
    "formats/text/options.py": (
        "tests/unit/formats/text/test_text.py, tests/unit/formats/test_stateless.py"
    ),
    "fs/clients.py": "tests/unit/fs/test_spec_credentials.py, tests/unit/fs/test_spec.py",
    "fs/counts.py": "tests/unit/fs/test_retry.py, tests/unit/cache/test_files.py",
    "fs/progress.py": "tests/unit/sources/test_broadcast.py, tests/unit/fs/test_listing.py",
    "fs/reported.py": "tests/unit/fs/test_identity.py",
    "fs/threads.py": "tests/unit/fs/test_ranges.py, tests/unit/stream/test_ahead.py",
    "iceberg/catalog.py": "tests/iceberg/test_storage.py, tests/remote/test_iceberg_catalogs.py",
    "iceberg/deletes.py": "tests/iceberg/test_deletes.py, tests/iceberg/test_planning.py",
    "iceberg/errors.py": "tests/unit/test_errors.py, tests/iceberg/test_snapshots.py",
    "iceberg/format.py": "tests/iceberg/test_read.py, tests/iceberg/test_optional.py",
    "iceberg/from_arrow.py": "tests/unit/iceberg/test_expressions.py",
    "iceberg/literals.py": "tests/unit/iceberg/test_expressions.py, tests/iceberg/test_filters.py",
    "iceberg/options.py": "tests/iceberg/test_read.py",
    "iceberg/planning.py": "tests/iceberg/test_planning.py",
    "iceberg/projection.py": "tests/iceberg/test_projection.py",
    "iceberg/scan.py": "tests/iceberg/test_filters.py",
    "iceberg/snapshots.py": "tests/iceberg/test_snapshots.py",
    "iceberg/storage.py": "tests/iceberg/test_storage.py",
    "iceberg/table.py": "tests/iceberg/test_read.py, tests/unit/iceberg/test_expressions.py",
    "metrics/page.py": "tests/unit/cli/test_profile.py",
    "planning/balanced.py": "tests/multiproc/test_balance.py",
    "planning/interleave.py": "tests/unit/planning/test_mixture.py, tests/unit/stream/test_mix.py",
    "planning/layout.py": "tests/unit/planning/test_streams.py, tests/unit/planning/test_resume.py",
    "planning/mixture_legs.py": "tests/unit/planning/test_mixture.py",
    "planning/phases.py": "tests/unit/planning/test_schedule.py",
    "planning/plan.py": (
        "tests/unit/planning/test_chunks.py, tests/unit/planning/test_portable_schema.py"
    ),
    "planning/strategy.py": (
        "tests/unit/planning/test_streams.py, tests/unit/planning/test_assign.py"
    ),
    "sources/files.py": "tests/unit/sources/test_steps.py, tests/unit/stream/test_wide_rows.py",
    "sources/planned.py": "tests/unit/test_dataset.py, tests/multiproc/test_mixture.py",
    "sources/prepare.py": "tests/unit/sources/test_steps.py",
    "sources/table_deletes.py": "tests/iceberg/test_planning.py, tests/conformance/test_tables.py",
    "sources/table_kinds.py": "tests/conformance/test_tables.py",
    "sources/table_planning.py": "tests/conformance/test_tables.py, tests/iceberg/test_planning.py",
    "sources/tables.py": "tests/conformance/test_tables.py, tests/iceberg/test_read.py",
    "stream/batches.py": "tests/unit/stream/test_blocks.py",
    "stream/pipeline.py": "tests/multiproc/test_read_ahead.py",
    "testing/conformance.py": "tests/conformance/test_parquet.py, tests/conformance/test_text.py",
    "testing/forks.py": "tests/conformance/test_forks.py",
    "testing/resume.py": "tests/conformance/test_parquet.py, tests/iceberg/test_resume.py",
    "testing/tables.py": "tests/conformance/test_tables.py",
    "transport/deaths.py": "tests/multiproc/test_killed_workers.py",
    "transport/descriptors.py": "tests/multiproc/test_long_tmpdir.py",
    "transport/device.py": "tests/multiproc/test_device.py",
    "webdataset/arrays.py": "tests/unit/webdataset/test_index.py",
    "webdataset/headers.py": "tests/unit/webdataset/test_reading.py",
    "webdataset/loading.py": "tests/unit/webdataset/test_index.py",
    "webdataset/options.py": (
        "tests/unit/webdataset/test_format.py, tests/unit/formats/test_stateless.py"
    ),
    "webdataset/slicing.py": (
        "tests/unit/webdataset/test_reading.py, tests/unit/webdataset/test_format.py"
    ),
}


def _modules() -> list[str]:
    """Every module of the package but ``__init__.py`` and ``__main__.py``, by path."""
    skip = {"__init__.py", "__main__.py"}
    return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if p.name not in skip)


def _own_tests(module: str) -> Path:
    path = Path(module)
    return UNIT / path.parent / f"test_{path.name}"


def test_each_module_has_its_test_file_or_says_where_it_is_tested() -> None:
    untested = [m for m in _modules() if not _own_tests(m).is_file() and m not in TESTED_IN]
    assert not untested, untested


def test_the_map_of_tests_names_modules_and_test_files_that_exist() -> None:
    modules = set(_modules())
    gone = sorted(set(TESTED_IN) - modules)
    own = sorted(m for m in TESTED_IN if _own_tests(m).is_file())
    missing = sorted(
        f"{module}: {test}"
        for module, tests in TESTED_IN.items()
        for test in tests.split(", ")
        if not test.startswith("tests/") or not (REPO / test).is_file()
    )
    assert not gone, f"modules no longer there: {gone}"
    assert not own, f"modules with their own test file now: {own}"
    assert not missing, f"test files not there: {missing}"
