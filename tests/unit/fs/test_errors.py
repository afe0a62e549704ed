"""Storage errors translated (`fs.errors`): a URL whose fsspec filesystem is not installed (s3fs,
gcsfs, adlfs) is refused naming the pip extra of this package that installs it, not only fsspec's
"Install s3fs"; a translated message shows no signature.

A missing filesystem is tried in a child process where importing the package fails
(``sys.modules[name] = None``), as it does where it is not installed: nothing is uninstalled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torch_dataloader_utils.fs import translate_os_error

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(120)

CHILD = """
import json, sys
for name in ("s3fs", "gcsfs", "adlfs"):
    sys.modules[name] = None  # its import now fails, as when it is not installed
import torch_dataloader_utils as tdu
out = {}
for url in sys.argv[1:]:
    try:
        tdu.create_dataloader(url, num_workers=0, storage_options={"anon": True})
    except Exception as exc:
        out[url] = [type(exc).__name__, str(exc), isinstance(exc, ImportError)]
print(json.dumps(out))
"""

# Each URL -> the extra that installs its filesystem, and the package (fsspec names it).
URLS = {
    "s3://bucket/train/": ("s3", "s3fs"),
    "s3a://bucket/train/": ("s3", "s3fs"),
    "gs://bucket/train/": ("gcs", "gcsfs"),
    "gcs://bucket/train/": ("gcs", "gcsfs"),
    "az://container/train/": ("azure", "adlfs"),
    "abfs://container/train/": ("azure", "adlfs"),
}


def test_a_missing_filesystem_names_the_extra_that_installs_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *URLS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    errors = json.loads(done.stdout.splitlines()[-1])
    for url, (extra, package) in URLS.items():
        name, message, is_import_error = errors[url]
        assert name == "MissingDependencyError" and is_import_error, errors[url]
        assert f"pip install 'torch-dataloader-utils[{extra}]'" in message, message
        assert url.split("://")[0] + ":// paths need" in message and package in message


def test_signatures_are_scrubbed_from_messages() -> None:
    exc = OSError("GetProperties failed for 'http://h/acct/c/b?sv=2&sig=SECRETSIG&se=1'")
    assert "SECRETSIG" not in str(translate_os_error(exc, "abfs://c/b"))
