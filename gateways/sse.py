"""Redaction of a ``text/event-stream`` body as its client reads it: joined across events.

Streamed JSON lines (``application/x-ndjson`` and kin, ``LINE_TYPES``) are read the same way,
each line one event whose data is the whole line.

A client joins what several events carry — the ``data:`` payloads, or the JSON string a model
streams as deltas (OpenAI ``choices[0].delta.content``, Anthropic ``delta.text`` …) — so a
secret split over events is whole again in the client. ``SseRedactor`` keeps one *stream* per
place a client may join: the raw ``data`` payloads of non-JSON events (data lines joined with no
separator), and, for events whose data is JSON, each path to a string value (``choices.0.delta
.content``) with the decoded strings. Each stream's joined text is redacted like a body
(``StreamRedactor``'s rule): what could still begin an occurrence is held, the rest is final.

Events are forwarded whole and in order, each as soon as none of its strings lies in a held
part — so a finished event is delayed only when its joined text ends in what could begin a form
of the secret, until the next event decides it. An occurrence found in the joined text is
replaced in the events that hold it: the marker in the first, nothing in the others (a JSON
event so changed is re-serialised). Every event is also redacted byte for byte before it goes.

Bounds (fail closed): at most ``MAX_HELD_EVENTS`` events or ``MAX_HELD_BYTES`` bytes are held;
past either, each stream's held text is redacted as if it were an occurrence and the events go.
An event longer than ``MAX_EVENT_BYTES`` without its blank line cuts the stream
(``sse_event_too_large``): it cannot be judged without the rest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from contract.errors import Reason, UpstreamError
from gateways.credential_scan import media_type
from gateways.redact import MARKER, Redactor, Span, StreamRedactor

MAX_HELD_EVENTS = 64
MAX_HELD_BYTES = 256 * 1024
MAX_EVENT_BYTES = 4 * 1024 * 1024
_TERMINATOR = rb"(?:\r\n|\n|\r(?!\n))"
_EVENT_END = re.compile(_TERMINATOR + _TERMINATOR)
_LINE_END = re.compile(_TERMINATOR)
# streamed JSON lines (Ollama, many model servers, OpenAI batch/ndjson): each line is one event's data
LINE_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl",
                        "application/x-jsonlines", "application/jsonlines", "application/json-seq"})
_LINE = re.compile(rb"([^\r\n]*)(\r\n|\n|\r|$)")
RAW = ("data",)  # the stream of non-JSON data payloads; JSON paths start with "json"

Key = tuple[Any, ...]


@dataclass
class _Event:
    raw: bytes
    data: list[tuple[int, int]]  # spans of the data values inside raw
    value: Any = None  # the parsed JSON data, if it is JSON
    strings: list[tuple[Key, bytes]] = field(default_factory=list)  # its pieces, in order
    edits: dict[int, list[Span]] = field(default_factory=dict)  # piece → replacements in it
    pending: int = 0  # pieces still inside some stream's held text

    def render(self) -> bytes:
        if not self.edits:
            return self.raw
        texts = [_edited(text, self.edits.get(i, [])) for i, (_, text) in enumerate(self.strings)]
        if self.value is None:  # raw data lines: splice the edited values in
            out, pos = [], 0
            for (start, end), text in zip(self.data, texts, strict=True):
                out += [self.raw[pos:start], text]
                pos = end
            return b"".join(out) + self.raw[pos:]
        values = iter(t.decode("utf-8", "surrogatepass") for t in texts)
        data = json.dumps(_replaced(self.value, values), ensure_ascii=False).encode("utf-8", "surrogatepass")
        first, last = self.data[0][0], self.data[-1][1]  # JSON over several data lines becomes one
        return self.raw[:first] + data + self.raw[last:]


@dataclass
class _Stream:
    text: bytes = b""
    base: int = 0  # offset of text[0] in everything this stream ever joined
    pieces: list[tuple[_Event, int, int, int]] = field(default_factory=list)  # event, piece, start, end


class SseRedactor:
    """``feed`` and ``finish`` like ``StreamRedactor``; ``count`` totals the redactions."""

    def __init__(self, redactor: Redactor, lines: bool = False) -> None:
        self._r = redactor
        self._lines = lines  # JSON lines: an event is one line, all of it data
        self._end = _LINE_END if lines else _EVENT_END
        self._buffer = b""
        self._held: list[_Event] = []
        self._streams: dict[Key, _Stream] = {}
        self.count = 0

    def feed(self, chunk: bytes) -> bytes:
        scanned = max(0, len(self._buffer) - 3)  # a blank line may straddle the chunks
        self._buffer += chunk
        pos = 0
        for end in self._end.finditer(self._buffer, scanned):
            self._add(self._buffer[pos:end.end()])
            pos = end.end()
        self._buffer = self._buffer[pos:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise UpstreamError(f"a server-sent event grew past {MAX_EVENT_BYTES} bytes",
                                Reason.SSE_EVENT_TOO_LARGE)
        if len(self._held) > MAX_HELD_EVENTS or sum(len(e.raw) for e in self._held) > MAX_HELD_BYTES:
            for stream in self._streams.values():
                self._settle(stream, [(0, len(stream.text), MARKER)] if stream.text else [], len(stream.text))
            # settled streams hold nothing: forget them, or a feed of ever-new JSON paths grows
            self._streams = {key: stream for key, stream in self._streams.items() if stream.text}
        return self._release()

    def finish(self, last: bytes = b"") -> bytes:
        released = self.feed(last) if last else b""
        if self._buffer:  # an unterminated last event: clients drop it, but it is sent redacted
            self._add(self._buffer)
            self._buffer = b""
        for stream in self._streams.values():
            spans = self._r._spans(stream.text)
            self._settle(stream, spans, len(stream.text))
        return released + self._release()

    def _add(self, raw: bytes) -> None:
        event = _parse(raw, self._lines)
        self._held.append(event)
        touched = set()
        for i, (key, text) in enumerate(event.strings):
            if text:
                stream = self._streams.setdefault(key, _Stream())
                start = stream.base + len(stream.text)
                stream.text += text
                stream.pieces.append((event, i, start, start + len(text)))
                event.pending += 1
                touched.add(key)
        for key in touched:
            stream = self._streams[key]
            boundary = len(stream.text) - self._r.held_suffix(stream.text)
            # as in StreamRedactor, an occurrence at the boundary may still grow; unless it is
            # complete (a string that ends with the secret must not hold its event)
            spans = [s for s in self._r._spans(stream.text) if s[0] < boundary or (
                s[1] == len(stream.text) and not self._r.can_grow(stream.text[s[0]:]))]
            self._settle(stream, spans, max(spans[-1][1], boundary) if spans else boundary)
            if not stream.text:  # nothing held: forget the path (an upstream may invent many)
                del self._streams[key]

    def _settle(self, stream: _Stream, spans: list[Span], cut: int) -> None:
        """Apply ``spans`` (offsets in ``stream.text``) to the pieces; ``text[:cut]`` is final."""
        self.count += len(spans)
        for start, end, marker in spans:
            a, b, first = stream.base + start, stream.base + end, True
            for event, i, p_start, p_end in stream.pieces:
                if p_start < b and a < p_end:
                    edit = (max(a, p_start) - p_start, min(b, p_end) - p_start, marker if first else b"")
                    event.edits.setdefault(i, []).append(edit)
                    first = False
        stream.base += cut
        stream.text = stream.text[cut:]
        kept = []
        for piece in stream.pieces:
            if piece[3] <= stream.base:
                piece[0].pending -= 1
            else:
                kept.append(piece)
        stream.pieces = kept

    def _release(self) -> bytes:
        out = []
        while self._held and self._held[0].pending == 0:
            clean, count = self._r.redact(self._held.pop(0).render())
            self.count += count
            out.append(clean)
        return b"".join(out)


def body_stream(redactor: Redactor, headers: list[tuple[bytes, bytes]]) -> SseRedactor | StreamRedactor:
    """The body's redactor: by events for ``text/event-stream`` and JSON lines, else by bytes."""
    content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    kind = media_type(content_type.decode("latin-1"))
    if kind == "text/event-stream" or kind in LINE_TYPES:
        return SseRedactor(redactor, lines=kind in LINE_TYPES)
    return redactor.stream()


def _parse(raw: bytes, lines: bool = False) -> _Event:
    data: list[tuple[int, int]] = []
    for line in _LINE.finditer(raw):
        if lines:  # the whole line (json-seq's leading RS byte is kept out)
            data.append((line.start() + (raw[:1] == b"\x1e"), line.end(1)))
            break
        content = line.group(1)
        if content == b"data" or content.startswith(b"data:"):
            start = line.start() + min(len(content), 5)
            if raw[start:start + 1] == b" ":
                start += 1
            data.append((start, line.end(1)))
        if not line.group(2):
            break
    event = _Event(raw, data)
    values = [raw[a:b] for a, b in data]
    try:
        value = json.loads(b"\n".join(values)) if values else None
    except ValueError:  # not JSON (nor UTF-8/16/32 text of JSON): the raw payload stream
        value = None
    # an object or array: its strings are what a client joins; a bare number or string is raw text
    event.value = value if isinstance(value, (dict, list)) else None
    if event.value is None:
        event.strings = [(RAW, v) for v in values]
    else:
        event.strings = [(("json", *path), s.encode("utf-8", "surrogatepass"))
                         for path, s in _strings(event.value, ())]
    return event


def _strings(value: Any, path: Key) -> list[tuple[Key, str]]:
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _strings(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _strings(v, (*path, i))]
    return []


def _replaced(value: Any, strings: Any) -> Any:
    """``value`` with its string values taken, in order, from the iterator ``strings``."""
    if isinstance(value, str):
        return next(strings)
    if isinstance(value, dict):
        return {k: _replaced(v, strings) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, strings) for v in value]
    return value


def _edited(text: bytes, edits: list[Span]) -> bytes:
    out, pos = [], 0
    for start, end, marker in sorted(edits):
        out += [text[pos:max(pos, start)], marker]
        pos = max(pos, end)
    return b"".join(out) + text[pos:]
