"""The cache's disk store: entries checked on read, written atomically, kept within the limit by
evicting what this loader does not use, shared by processes without two downloads of one range;
a killed writer or a full disk never leaves an entry that is served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key
from torch_dataloader_utils.cache.store import ROOT

REPO = Path(__file__).resolve().parents[3]


def _store(tmp_path: Path, limit: int | None = None, since: float | None = None) -> RangeStore:
    config = CacheConfig(str(tmp_path), limit, since if since is not None else time.time())
    return RangeStore(config)


def _payload(key: str, offset: int, size: int) -> bytes:
    """Bytes that name their file and place (what a store would hold there)."""
    seed = f"{key}:{offset}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def _entries(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / ROOT / "data").rglob("*") if p.is_file()]


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_a_range_comes_back_whole_or_from_entries_side_by_side(tmp_path: Path) -> None:
    store = _store(tmp_path)
    key = file_key("s3://b/f.parquet", 10_000, "ETag=1")
    data = _payload(key, 0, 10_000)
    assert store.get(key, 0, 100) is None
    assert store.put(key, 0, data[:4000])
    assert store.put(key, 4000, data[4000:7000])
    assert store.get(key, 0, 4000) == data[:4000]
    assert store.get(key, 100, 50) == data[100:150]  # inside one entry
    assert store.get(key, 3000, 3500) == data[3000:6500]  # across two
    assert store.get(key, 6000, 2000) is None  # past what is held
    other = RangeStore(store.config)  # another process's view finds them too
    assert other.get(key, 3990, 20) == data[3990:4010]


def test_an_entry_that_fails_its_check_is_removed_not_served(tmp_path: Path) -> None:
    store = _store(tmp_path)
    key = file_key("s3://b/f", 5000, "ETag=1")
    store.put(key, 0, _payload(key, 0, 5000))
    (entry,) = _entries(tmp_path)
    raw = bytearray(entry.read_bytes())
    raw[100] ^= 0xFF  # one flipped bit in the payload
    entry.write_bytes(bytes(raw))
    fresh = RangeStore(store.config)  # (not the process that checked it before)
    assert fresh.get(key, 0, 5000) is None
    assert not entry.exists()
    assert fresh.counter.snapshot().corrupt == 1
    # a torn entry (shorter than its header says) likewise
    fresh.put(key, 0, _payload(key, 0, 5000))
    (entry,) = _entries(tmp_path)
    entry.write_bytes(entry.read_bytes()[:3000])
    assert RangeStore(store.config).get(key, 0, 5000) is None


def test_the_limit_evicts_what_this_run_does_not_use_oldest_first(tmp_path: Path) -> None:
    before = _store(tmp_path, limit=10 * 1016)  # ten entries of 1000 bytes (+16 of header)
    keys = [file_key(f"s3://b/{i}", 1000, "v") for i in range(10)]
    for i, key in enumerate(keys):
        assert before.put(key, 0, _payload(key, 0, 1000))
        entry = tmp_path / ROOT / "data" / key[:2] / key / "0-1000"
        os.utime(entry, (1000 + i, 1000 + i))  # used long ago, in this order
    run = _store(tmp_path, limit=10 * 1016)  # a new run
    assert run.get(keys[0], 0, 1000) is not None  # used by this run: kept from now on
    new = file_key("s3://b/new", 1000, "v")
    assert run.put(new, 0, _payload(new, 0, 1000))
    held = {p.parent.name for p in _entries(tmp_path)}
    assert keys[0] in held and new in held
    assert keys[1] not in held  # the least recently used of the rest went first
    assert keys[9] in held  # and only as many as the room needed (a tenth more)
    assert run.summary().bytes <= 10 * 1016
    assert run.counter.snapshot().evicted == 2


def test_a_full_cache_of_this_runs_entries_bypasses_new_ranges(tmp_path: Path) -> None:
    store = _store(tmp_path, limit=3 * 1016)
    keys = [file_key(f"s3://b/{i}", 1000, "v") for i in range(5)]
    stored = [store.put(k, 0, _payload(k, 0, 1000)) for k in keys]
    assert stored == [True, True, True, False, False]  # kept, not churned
    assert {p.parent.name for p in _entries(tmp_path)} == set(keys[:3])
    stats = store.counter.snapshot()
    assert (stats.bypassed, stats.evicted) == (2, 0)
    assert store.summary().bytes == 3 * 1016
    assert store.put(keys[0], 0, _payload(keys[0], 0, 1000))  # (already held)


def test_processes_sharing_a_cache_stay_under_its_limit(tmp_path: Path) -> None:
    limit = 40 * 4096
    code = f"""
        import random, sys, time
        from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key
        from tests.unit.cache.test_store import _payload
        store = RangeStore(CacheConfig({str(tmp_path)!r}, {limit}, time.time() - 3600))
        rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
        for _ in range(150):
            key = file_key(f"s3://b/{{rng.randrange(40)}}", 10**6, "v")
            offset = rng.randrange(8) * 4000
            got = store.get(key, offset, 4000)
            if got is None:
                store.put(key, offset, _payload(key, offset, 4000))
            else:
                assert got == _payload(key, offset, 4000), (key, offset)
        print("ok")
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", err[-2000:]
    summary = _store(tmp_path).summary()
    assert 0 < summary.bytes <= limit, summary
    assert summary.leftovers == 0


def test_one_download_of_a_range_however_many_processes_ask(tmp_path: Path) -> None:
    log = tmp_path / "downloads"
    code = f"""
        import os, time
        from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key
        store = RangeStore(CacheConfig({str(tmp_path / "c")!r}))
        key = file_key("s3://b/f", 10**6, "v")
        time.sleep(max(0.0, {time.time() + 1.5} - time.time()))  # all at once
        with store.claim(key, 0, 5000):
            if store.get(key, 0, 5000) is None:
                with open({str(log)!r}, "a") as f:
                    f.write(f"{{os.getpid()}}\\n")
                time.sleep(0.3)  # the download
                store.put(key, 0, b"x" * 5000)
        assert store.get(key, 0, 5000) == b"x" * 5000
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env) for _ in range(4)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert len(log.read_text().split()) == 1


def test_a_killed_writer_leaves_no_entry_that_is_served(tmp_path: Path) -> None:
    code = f"""
        from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key
        store = RangeStore(CacheConfig({str(tmp_path)!r}, 10**10))
        key = file_key("s3://b/big", 10**9, "v")
        data = bytes(256 << 20)
        print("ready", flush=True)
        while True:
            store.put(key, 0, data)
            store.clear()
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.time() + 30
        while time.time() < deadline:  # kill it while a temporary file is being written
            tmp = [p for p in (tmp_path / ROOT).rglob(".*.tmp") if p.stat().st_size > 0]
            if tmp:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
        else:
            pytest.fail("never saw the write in progress")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    store = _store(tmp_path, limit=10**10)
    key = file_key("s3://b/big", 10**9, "v")
    if not (tmp_path / ROOT / "data" / key[:2] / key / f"0-{256 << 20}").exists():
        assert store.get(key, 0, 256 << 20) is None
        assert store.get(key, 0, 100) is None
    assert store.summary().leftovers >= 1  # the dead writer's temporary file, never read
    store.room.evict(target=0, limit=10**10)  # an eviction scan removes it
    assert store.summary().leftovers == 0


def test_a_write_that_fails_is_read_on_uncached(tmp_path: Path) -> None:
    # A file size limit makes the write fail as a full disk does (in its own process).
    result = _run(f"""
        import logging, resource, signal
        logging.basicConfig()
        from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        store = RangeStore(CacheConfig({str(tmp_path)!r}, 10**9))
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
        key = file_key("s3://b/f", 10**6, "v")
        assert store.put(key, 0, b"y" * 40_000)
        assert not store.put(key, 40_000, b"z" * 100_000)
        assert store.get(key, 40_000, 100_000) is None
        assert store.counter.snapshot().write_errors == 1
        print(store.summary().bytes)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) == 40_016  # no half entry, no temporary file
    assert "cannot write an entry" in result.stderr
    usage = (tmp_path / ROOT / "usage").read_bytes()
    assert int.from_bytes(usage[4:], "little") == 40_016  # the reservation given back


def test_entries_are_made_with_the_users_umask(tmp_path: Path) -> None:
    result = _run(f"""
        import os
        from torch_dataloader_utils.cache import CacheConfig, RangeStore, file_key
        os.umask(0o077)
        store = RangeStore(CacheConfig({str(tmp_path)!r}, 10**9))
        store.put(file_key("s3://b/f", 10, "v"), 0, b"0123456789")
    """)
    assert result.returncode == 0, result.stderr
    (entry,) = _entries(tmp_path)
    assert entry.stat().st_mode & 0o777 == 0o600
    assert entry.parent.stat().st_mode & 0o777 == 0o700


def test_handles_give_their_lock_files_back(tmp_path: Path) -> None:
    # A reader (each epoch's, in each worker) makes its own handle: none may keep descriptors.
    import gc

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    config = CacheConfig(str(tmp_path), 10**9)
    RangeStore(config).put(file_key("s3://b/warm", 10, "v"), 0, b"x")  # directories made
    gc.collect()
    before = open_fds()
    for i in range(300):
        store = RangeStore(config)
        key = file_key(f"s3://b/{i}", 10, "v")
        with store.claim(key, 0, 10):
            store.put(key, 0, b"0123456789")
        del store
    gc.collect()
    assert open_fds() <= before + 2
