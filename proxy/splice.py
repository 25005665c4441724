"""A tunnel's bytes relayed by the kernel: socket → pipe → socket with ``splice(2)`` (Linux), so
no byte is copied into Python once the ClientHello has been checked and sent on.

    relay = Relay(loop, client, upstream, sent, received)   # non-blocking sockets
    await relay.done                                        # both directions ended, or one failed
    relay.close()

Each direction owns a pipe (at most ``PIPE_SIZE`` bytes: the tunnel's memory, whatever the
transfer) and is driven by the event loop's readiness callbacks: the source is read only while
the pipe is empty, and while the destination cannot take the pipe's bytes the source is not
read at all (flow control: a slow side stops the other). A source's end of stream half-closes
the destination (``shutdown(SHUT_WR)``) and the other direction goes on; the relay is done when
both have ended, or at once when a side fails (reset, broken pipe). Where ``os.splice`` is
missing, ``AVAILABLE`` is false and the tunnel relays through asyncio protocols instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket

AVAILABLE = hasattr(os, "splice") and hasattr(os, "pipe2")
PIPE_SIZE = 1 << 20  # bytes in flight per direction (the default pipe holds 64 KiB: 16x the syscalls)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


class _Direction:
    """``src`` → pipe → ``dst``; ``counter[0]`` counts the bytes read from ``src``."""

    def __init__(self, relay: Relay, src: socket.socket, dst: socket.socket, counter: list[int]) -> None:
        self.relay, self.loop = relay, relay.loop
        self.src, self.dst, self.counter = src, dst, counter
        self.src_fd, self.dst_fd = src.fileno(), dst.fileno()  # the loop's callbacks take plain fds
        self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # a smaller pipe only costs more calls
            fcntl.fcntl(self.pipe_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.size = fcntl.fcntl(self.pipe_w, fcntl.F_GETPIPE_SZ)
        self.queued = 0  # bytes in the pipe
        self.reading = self.writing = self.ended = False

    def start(self) -> None:
        self._watch(reading=True, writing=False)

    def _watch(self, reading: bool, writing: bool) -> None:
        """Read the source, write the destination: each callback on only while it is wanted."""
        if reading != self.reading:
            if reading:
                self.loop.add_reader(self.src_fd, self._readable)
            else:
                self.loop.remove_reader(self.src_fd)
        if writing != self.writing:
            if writing:
                self.loop.add_writer(self.dst_fd, self._writable)
            else:
                self.loop.remove_writer(self.dst_fd)
        self.reading, self.writing = reading, writing

    def _readable(self) -> None:
        try:
            moved = os.splice(self.src_fd, self.pipe_w, self.size, flags=_FLAGS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.relay.fail()
            return
        if moved == 0 and not self._at_end():
            return
        if moved == 0:  # end of stream: half-close the other side, the other direction goes on
            self._watch(reading=False, writing=self.writing)
            self.ended = True
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)
            self.relay.ended()
            return
        self.counter[0] += moved
        self.queued += moved
        self._writable()

    def _at_end(self) -> bool:
        """Whether a splice that moved nothing met the end of the stream. TCP's splice can also
        move nothing with data queued (urgent data; seen with the process under ptrace): those
        bytes are copied into the pipe instead, so nothing is cut and the loop cannot spin."""
        try:
            data = self.src.recv(min(self.size, 1 << 16))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.relay.fail()
            return False
        if not data:
            return True
        written = os.write(self.pipe_w, data)  # the pipe is empty and holds at least this much
        if written != len(data):
            self.relay.fail()
            return False
        self.counter[0] += written
        self.queued += written
        self._writable()
        return False

    def _writable(self) -> None:
        while self.queued:
            try:
                moved = os.splice(self.pipe_r, self.dst_fd, self.queued, flags=_FLAGS)
            except (BlockingIOError, InterruptedError):
                # the destination is full: stop reading the source until it drains
                self._watch(reading=False, writing=True)
                return
            except OSError:
                self.relay.fail()
                return
            self.queued -= moved
        self._watch(reading=not self.ended, writing=False)

    def close(self) -> None:
        self._watch(reading=False, writing=False)
        for fd in (self.pipe_r, self.pipe_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class Relay:
    """Both directions of one tunnel; ``done`` resolves when it is over (never raises)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: socket.socket, upstream: socket.socket,
                 sent: list[int], received: list[int]) -> None:
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self._directions = [_Direction(self, client, upstream, sent),
                            _Direction(self, upstream, client, received)]
        for direction in self._directions:
            direction.start()

    def ended(self) -> None:
        if all(d.ended for d in self._directions) and not self.done.done():
            self.done.set_result(None)

    def fail(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        for direction in self._directions:
            direction.close()
