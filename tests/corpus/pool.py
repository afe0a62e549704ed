"""A child process that runs corpus requests (`tests.corpus.runner`), restarted after a crash
or a request that runs past its timeout."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class Runner:
    """One ``python -m tests.corpus.runner`` child at a time."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            env.pop(name, None)
        return subprocess.Popen(
            [sys.executable, "-m", "tests.corpus.runner"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def run(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The verdict on ``request``; a crash or a hang is a verdict too."""
        if self._child is None or self._child.poll() is not None:
            self._child = self._start()
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(request) + "\n")
        child.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    return {"verdict": "hang", "detail": f"no answer within {timeout} s"}
                if selector.select(left):
                    break
        line = child.stdout.readline()
        if not line:
            code = child.wait()
            self._child = None
            return {"verdict": "crash", "detail": f"the reading process died (exit {code})"}
        verdict: dict[str, Any] = json.loads(line)
        return verdict

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None
