"""A delaying TCP proxy: what a real network's round trip adds, on loopback, for a kernel without netem.

    with DelayProxies([(("127.0.0.5", 3222), ("127.0.0.5", 2222))], rtt=0.020) as proxies:
        ... connect to 127.0.0.5:3222 ...; proxies.bytes_up, proxies.bytes_down

Every chunk read from one side is written to the other side RTT/2 after it was read, in the order it was read (a
FIFO per direction, one writer each), so a request and its answer take at least one RTT more than without the
proxy; the target is connected one RTT after the client was accepted (the TCP handshake). EOF travels the same way
(half-close), and a connection ends when both directions have ended. It is bounded: it listens on loopback only,
buffers at most MAX_BUFFERED bytes per direction before it stops reading (as a full TCP window would), and its
event loop stops by itself after `lifetime` seconds or when the `with` block ends. It models latency only: no
bandwidth limit, no loss, no congestion window.
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from collections import deque
from collections.abc import Iterable

MAX_BUFFERED = 4 << 20
READ_CHUNK = 1 << 16

Address = tuple[str, int]


class DelayProxies:
    """One listener per (listen, target) pair, all served by one event loop in a daemon thread."""

    def __init__(self, pairs: Iterable[tuple[Address, Address]], rtt: float, *, lifetime: float = 3600.0) -> None:
        self.pairs = list(pairs)
        for listen, _ in self.pairs:
            if not ipaddress.ip_address(listen[0]).is_loopback:
                raise ValueError(f"delay proxy: {listen[0]} is not a loopback address")
        if rtt < 0 or lifetime <= 0:
            raise ValueError("delay proxy: rtt >= 0 and lifetime > 0")
        self.one_way = rtt / 2
        self.lifetime = lifetime
        self.bytes_up = 0     # client -> target, every connection so far
        self.bytes_down = 0   # target -> client
        self.connections = 0
        self.turns = 0        # times the data changed direction on a connection: twice per round trip it waited on
        self.addresses: list[Address] = []  # where each pair listens (a port 0 asked for is chosen then)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)

    def __enter__(self) -> DelayProxies:
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and drop every connection; returns once the loop has ended."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def counters(self) -> tuple[int, int, int, int]:
        """(bytes up, bytes down, connections, turns) so far."""
        return self.bytes_up, self.bytes_down, self.connections, self.turns

    # -- the loop ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of __enter__
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task] = set()

        def handler(target: Address):
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                task = asyncio.current_task()
                tasks.add(task)
                try:
                    await self._connection(reader, writer, target)
                except asyncio.CancelledError:
                    writer.close()  # the proxies are closing: end quietly (asyncio logs a cancelled handler)
                finally:
                    tasks.discard(task)
            return handle

        servers = []
        try:
            for listen, target in self.pairs:
                server = await asyncio.start_server(handler(target), listen[0], listen[1], reuse_address=True)
                servers.append(server)
                self.addresses.append(server.sockets[0].getsockname()[:2])
        except BaseException as exc:
            for server in servers:
                server.close()
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await asyncio.wait_for(self._stop.wait(), self.lifetime)
        except asyncio.TimeoutError:
            pass
        for server in servers:
            server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                          target: Address) -> None:
        self.connections += 1
        if self.one_way:
            await asyncio.sleep(2 * self.one_way)  # the TCP handshake: the client's connect cost a round trip
        try:
            target_reader, target_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        last = [None]  # the direction of the connection's last chunk
        pipes = {asyncio.ensure_future(self._pipe(client_reader, target_writer, up=True, last=last)),
                 asyncio.ensure_future(self._pipe(target_reader, client_writer, up=False, last=last))}
        try:
            while pipes:
                done, pipes = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
                if not all(task.result() for task in done):
                    break  # one side failed: end the connection rather than wait for the other's EOF
        finally:
            for task in pipes:
                task.cancel()
            for writer in (client_writer, target_writer):
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool,
                    last: list) -> bool:
        """Forward one direction: each chunk (and then EOF) written one_way seconds after it was read; False when
        the writing side failed."""
        loop = asyncio.get_running_loop()
        queue: deque[tuple[float, bytes]] = deque()
        buffered = 0
        have_item, have_room = asyncio.Event(), asyncio.Event()
        have_room.set()

        async def read_side() -> None:
            nonlocal buffered
            while True:
                await have_room.wait()
                try:
                    chunk = await reader.read(READ_CHUNK)
                except OSError:
                    chunk = b""
                queue.append((loop.time() + self.one_way, chunk))
                buffered += len(chunk)
                if up:
                    self.bytes_up += len(chunk)
                else:
                    self.bytes_down += len(chunk)
                if chunk and last[0] is not None and last[0] != up:
                    self.turns += 1
                if chunk:
                    last[0] = up
                if buffered >= MAX_BUFFERED:
                    have_room.clear()
                have_item.set()
                if not chunk:
                    return

        async def write_side() -> bool:
            nonlocal buffered
            while True:
                await have_item.wait()
                due, chunk = queue.popleft()
                if not queue:
                    have_item.clear()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return True
                writer.write(chunk)
                await writer.drain()
                buffered -= len(chunk)
                if buffered < MAX_BUFFERED:
                    have_room.set()

        reading = asyncio.ensure_future(read_side())
        try:
            return await write_side()
        except OSError:
            return False  # the other side is gone: the connection ends
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
