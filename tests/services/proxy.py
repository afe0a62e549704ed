"""A fault-injecting HTTP/1.1 proxy on loopback, to put in front of a storage server.

Clients talk to the proxy as if it were the server (``endpoint_url=proxy.endpoint_url``). It
forwards each request byte for byte (the Host header unchanged, so S3 SigV4 signatures still
verify) over a keep-alive connection of its own, and relays the response. For a share of the
requests, drawn from a seeded RNG, it injects a fault instead:

- ``slowdown``: answers ``503 SlowDown`` with an S3 XML error body (nothing is forwarded);
- ``slow``: waits ``delay`` seconds, then forwards;
- ``drop``: closes the connection, either before answering (``before``) or after sending the
  response head and half of its body (``mid``).

It counts requests, connections and each fault, can be reconfigured while running
(`FaultProxy.configure`), and stops cleanly (`FaultProxy.stop`). One thread per client
connection; requests are parsed only as far as framing needs (head, then a Content-Length or
chunked body), responses likewise (Content-Length, chunked, or until close).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .ports import HOST

__all__ = ["FAULTS", "FaultConfig", "FaultProxy", "Request"]

FAULTS = ("slowdown", "slow", "drop")
_MAX_LINE = 65536
_MAX_HEADERS = 200
_SOCKET_TIMEOUT = 120.0


class _Closed(Exception):
    """The peer closed the connection before a message began."""


@dataclass(frozen=True)
class Request:
    """One parsed request: what the fault rules look at, and its raw bytes to forward."""

    method: str
    target: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    raw: bytes  # head and body, exactly as received

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def ranged(self) -> bool:
        """A GET with a Range header (what readers of columnar files mostly send)."""
        return self.method == "GET" and self.header("range") is not None


@dataclass(frozen=True)
class FaultConfig:
    """What the proxy injects; rates are shares of the eligible requests (summing to <= 1).

    Attributes:
        slowdown_rate: answer ``503 SlowDown`` without forwarding.
        slow_rate: wait ``delay`` seconds before forwarding.
        drop_rate: close the connection (``drop_mode``: ``"before"`` answering, ``"mid"``
            response, or ``"any"`` of the two, drawn per fault).
        delay: seconds a ``slow`` request waits.
        ranged_gets_only: only GETs with a Range header are eligible.
        methods: only these methods are eligible (None: all).
        match: only requests for which this returns True are eligible (None: all).
        max_faults: inject at most this many faults in all (None: no limit).
    """

    slowdown_rate: float = 0.0
    slow_rate: float = 0.0
    drop_rate: float = 0.0
    delay: float = 0.2
    drop_mode: str = "any"
    ranged_gets_only: bool = False
    methods: tuple[str, ...] | None = None
    match: Callable[[Request], bool] | None = field(default=None, compare=False)
    max_faults: int | None = None

    def __post_init__(self) -> None:
        rates = (self.slowdown_rate, self.slow_rate, self.drop_rate)
        if any(r < 0 for r in rates) or sum(rates) > 1 + 1e-9:
            raise ValueError(f"fault rates must be >= 0 and sum to <= 1, got {rates}")
        if self.drop_mode not in ("before", "mid", "any"):
            raise ValueError(f"drop_mode must be 'before', 'mid' or 'any', got {self.drop_mode!r}")

    def eligible(self, request: Request) -> bool:
        if self.ranged_gets_only and not request.ranged:
            return False
        if self.methods is not None and request.method not in self.methods:
            return False
        return self.match is None or bool(self.match(request))


def _slowdown_response(target: str) -> bytes:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
        f"<Resource>{target.split('?', 1)[0]}</Resource>"
        "<RequestId>tdu-fault-proxy</RequestId></Error>"
    ).encode()
    head = (
        "HTTP/1.1 503 Slow Down\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 0\r\n"
        "x-amz-request-id: tdu-fault-proxy\r\n"
        "\r\n"
    ).encode()
    return head + body


def _read_line(reader: BinaryIO) -> bytes:
    line = reader.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ValueError("header line too long")
    return line


def _read_head(reader: BinaryIO) -> tuple[bytes, str, dict[str, str]]:
    """Read a message head; returns (raw head, start line, headers). Raises _Closed on EOF."""
    first = _read_line(reader)
    while first in (b"\r\n", b"\n"):  # tolerate stray blank lines between messages
        first = _read_line(reader)
    if not first:
        raise _Closed
    raw = [first]
    headers: dict[str, str] = {}
    while True:
        line = _read_line(reader)
        if not line:
            raise ConnectionError("connection closed inside a message head")
        raw.append(line)
        if line in (b"\r\n", b"\n"):
            break
        if len(raw) > _MAX_HEADERS:
            raise ValueError("too many headers")
        name, _, value = line.decode("latin-1").partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return b"".join(raw), first.decode("latin-1").strip(), headers


def _read_exact(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise ConnectionError(f"connection closed after {len(data)} of {size} body bytes")
    return data


def _read_chunked(reader: BinaryIO) -> bytes:
    """A chunked body, raw (sizes, chunks and trailers, as framed on the wire)."""
    parts: list[bytes] = []
    while True:
        line = _read_line(reader)
        if not line:
            raise ConnectionError("connection closed inside a chunked body")
        parts.append(line)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers, up to the blank line
                trailer = _read_line(reader)
                if not trailer:
                    raise ConnectionError("connection closed inside chunked trailers")
                parts.append(trailer)
                if trailer in (b"\r\n", b"\n"):
                    return b"".join(parts)
        parts.append(_read_exact(reader, size + 2))


def _read_body(reader: BinaryIO, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(reader)
    length = headers.get("content-length")
    return _read_exact(reader, int(length)) if length else b""


def _wants_close(version_line: str, headers: dict[str, str], *, response: bool) -> bool:
    connection = headers.get("connection", "").lower()
    version = version_line.split(maxsplit=1)[0] if response else version_line.rsplit(" ", 1)[-1]
    return "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)


@dataclass
class _Response:
    head: bytes
    body: bytes
    close: bool

    @property
    def raw(self) -> bytes:
        return self.head + self.body


def _read_response(reader: BinaryIO, method: str) -> _Response:
    while True:
        head, status_line, headers = _read_head(reader)
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if 100 <= status < 200 and status != 101:
            continue  # interim (100 Continue): the proxy already told the client to go on
        break
    close = _wants_close(status_line, headers, response=True)
    if method == "HEAD" or status in (204, 304):
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower() or headers.get("content-length"):
        body = _read_body(reader, headers)
    else:  # delimited by the end of the connection
        body, close = reader.read(), True
    return _Response(head, body, close)


class _Upstream:
    """One keep-alive connection to the server, reopened when the server closed it."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock: socket.socket | None = None
        self.reader: BinaryIO | None = None
        self.used = False

    def _connect(self) -> None:
        self.close()
        self.sock = socket.create_connection(self.address, timeout=_SOCKET_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        self.used = False

    def exchange(self, request: Request) -> _Response:
        for attempt in range(2):
            if self.sock is None:
                self._connect()
            assert self.sock is not None and self.reader is not None
            reused = self.used
            try:
                self.sock.sendall(request.raw)
                self.used = True
                response = _read_response(self.reader, request.method)
            except (_Closed, ConnectionError) as exc:
                # A reused keep-alive connection the server closed meanwhile: retry once anew.
                self.close()
                stale = isinstance(exc, _Closed | ConnectionResetError | BrokenPipeError)
                if reused and attempt == 0 and stale:
                    continue
                raise ConnectionError("the upstream server closed the connection") from exc
            if response.close:
                self.close()
            return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        for closable in (self.reader, self.sock):
            if closable is not None:
                with contextlib.suppress(OSError):
                    closable.close()
        self.sock = self.reader = None


class FaultProxy:
    """The proxy; see the module docstring. Use as a context manager or call `stop`.

    Args:
        upstream: ``(host, port)`` of the server.
        seed: seeds the RNG that picks the faulty requests.
        **config: `FaultConfig` fields.
    """

    def __init__(self, upstream: tuple[str, int], *, seed: int = 0, **config: Any) -> None:
        self.upstream = upstream
        self._config = FaultConfig(**config)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self.events: list[tuple[str, str, str]] = []  # (method, target, outcome)
        self._stopping = threading.Event()
        self._clients: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"fault-proxy-{self.port}", daemon=True
        )
        self._acceptor.start()

    # --- control --------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def config(self) -> FaultConfig:
        return self._config

    def configure(self, *, seed: int | None = None, **changes: Any) -> FaultConfig:
        """Change fault settings while running (e.g. ``configure(drop_rate=0)``); reseed."""
        with self._lock:
            self._config = dataclasses.replace(self._config, **changes)
            if seed is not None:
                self._rng.seed(seed)
            return self._config

    def disable(self) -> None:
        """Forward everything from now on."""
        self.configure(slowdown_rate=0.0, slow_rate=0.0, drop_rate=0.0)

    @property
    def counts(self) -> dict[str, int]:
        """``requests``, ``forwarded``, ``connections`` and one count per fault kind (plus
        ``drop_before``/``drop_mid``); a snapshot."""
        with self._lock:
            out = {k: 0 for k in ("requests", "forwarded", "connections", *FAULTS)}
            out.update(self._counts)
            return out

    @property
    def faults(self) -> int:
        """Faults injected so far, of every kind."""
        counts = self.counts
        return sum(counts[k] for k in FAULTS)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()
            self.events.clear()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, and join the threads. Idempotent."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout)
        with self._lock:
            clients, threads = list(self._clients), list(self._threads)
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FaultProxy({self.endpoint_url} -> {self.upstream[0]}:{self.upstream[1]})"

    # --- serving --------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            with self._lock:
                if self._stopping.is_set():
                    client.close()
                    return
                self._counts["connections"] += 1
                self._clients.add(client)
                self._threads.add(thread)
            thread.start()

    def _decide(self, request: Request) -> str | None:
        with self._lock:
            self._counts["requests"] += 1
            config = self._config
            if not config.eligible(request):
                return None
            if config.max_faults is not None and sum(self._counts[k] for k in FAULTS) >= (
                config.max_faults
            ):
                return None
            draw = self._rng.random()
            fault: str | None = None
            for kind, rate in zip(
                FAULTS, (config.slowdown_rate, config.slow_rate, config.drop_rate), strict=True
            ):
                if draw < rate:
                    fault = kind
                    break
                draw -= rate
            if fault == "drop":
                mode = config.drop_mode
                if mode == "any":
                    mode = self._rng.choice(("before", "mid"))
                self._counts[f"drop_{mode}"] += 1
                fault = f"drop_{mode}"
            if fault is not None:
                self._counts[fault.split("_")[0]] += 1
            return fault

    def _record(self, request: Request, outcome: str) -> None:
        with self._lock:
            if outcome == "forwarded":
                self._counts["forwarded"] += 1
            self.events.append((request.method, request.target, outcome))

    def _serve(self, client: socket.socket) -> None:
        upstream = _Upstream(self.upstream)
        reader: BinaryIO | None = None
        try:
            client.settimeout(_SOCKET_TIMEOUT)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = client.makefile("rb")
            while not self._stopping.is_set():
                try:
                    head, request_line, headers = _read_head(reader)
                except _Closed:
                    return
                if "100-continue" in headers.get("expect", "").lower():
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(reader, headers)
                method, _, rest = request_line.partition(" ")
                request = Request(method, rest.rsplit(" ", 1)[0], headers, head + body)
                client_close = _wants_close(request_line, headers, response=False)
                fault = self._decide(request)
                # Counted before the client can see the outcome, so counts read after a
                # response include it.
                if fault == "slowdown":
                    self._record(request, fault)
                    client.sendall(_slowdown_response(request.target))
                    if client_close:
                        return
                    continue
                if fault == "drop_before":
                    self._record(request, fault)
                    return
                if fault == "slow" and self._stopping.wait(self._config.delay):
                    return
                response = upstream.exchange(request)
                if fault == "drop_mid":
                    cut = len(response.head) + len(response.body) // 2
                    if not response.body:
                        cut = len(response.head) // 2
                    self._record(request, fault)
                    client.sendall(response.raw[:cut])
                    return
                self._record(request, "forwarded")
                client.sendall(response.raw)
                if response.close or client_close:
                    return
        except (OSError, ValueError):
            return  # the client or the server went away, or sent garbage: drop the connection
        finally:
            upstream.close()
            if reader is not None:
                with contextlib.suppress(OSError):
                    reader.close()
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                client.close()
            with self._lock:
                self._clients.discard(client)
                self._threads.discard(threading.current_thread())
