"""Streaming redaction throughput (a benchmark, not a test).

    .venv/bin/python bench/redact.py                    # 1 MB and 100 MB, 64 KiB chunks, 5 runs each
    .venv/bin/python bench/redact.py --compare          # also the matchers that were not chosen
    .venv/bin/python bench/redact.py --body escapes     # a worst case: escape-dense URL/JSON text
    .venv/bin/python bench/redact.py --sse 20000        # an LLM event stream through SseRedactor
    python -m bench.redact --smoke                      # what ./scripts/bench --smoke runs

The body is JSON-like API text with every enumerated form of one secret (gateways/secret_forms.py, plus
``Bearer <secret>`` and the secret inside longer base64 blobs) placed every ``--every`` bytes. It
is fed to one StreamRedactor in ``--chunk`` pieces on one core; the figure is body bytes per
second (MB = 10^6 bytes), median of ``--repeat`` runs, with min and max.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateways.redact import MARKER, Redactor, forms
from gateways.secret_forms import texts
from gateways.sse import SseRedactor
from gateways.text_regex import compile_text

SECRET = b"real-bench-secret-9f3c2a7d1e5b4c6a8f0d2e4b"
WORDS = [b"issue", b"comment", b"repository", b"created_at", b"state", b"open", b"closed", b"labels",
         b"the", b"fix", b"when", b"request", b"https://api.example.com/v1/items?page=2&per_page=100",
         b"null", b"true", b"line one\\nline two", b"\\\"quoted\\\""]
ESCAPE_WORDS = [b"a%20b", b"path%2Fto%2Fx", b"caf\\u00e9", b"a&amp;b", b"x=1&y=2", b"%3D", b"&#39;", b"\\/"]


def block(size: int, every: int, escapes: bool, seed: int = 1) -> tuple[bytes, int]:
    """``size`` bytes of text with every form of SECRET each ``every`` bytes; (block, forms placed)."""
    rnd = random.Random(seed)  # noqa: S311 - filler text, not a secret
    words = [*WORDS, *(ESCAPE_WORDS * 4)] if escapes else WORDS
    leaks = [*sorted(forms(SECRET)), b"Bearer " + SECRET, base64.b64encode(b"x-access-token:" + SECRET),
             base64.b64encode(b"\x01" + SECRET + b"\xff\xfe")]
    out, placed, next_leak = bytearray(), 0, every
    while len(out) < size:
        out += b'{"id": %d, "node": "%s", "body": "%s"},\n' % (
            rnd.randrange(10**9), base64.b64encode(rnd.randbytes(12)),
            b" ".join(rnd.choice(words) for _ in range(12)))
        if len(out) >= next_leak:
            out += b' "echo": "' + leaks[placed % len(leaks)] + b'",\n'
            placed += 1
            next_leak += every
    return bytes(out), placed


def body(megabytes: int, every: int, escapes: bool) -> tuple[bytes, int]:
    one, placed = block(1_000_000, every, escapes)
    return one * megabytes, placed * megabytes


def stream_once(redactor: Redactor, data: bytes, chunk: int) -> tuple[float, int]:
    view = memoryview(data)
    stream = redactor.stream()
    started = time.perf_counter()
    for i in range(0, len(data), chunk):
        stream.feed(bytes(view[i:i + chunk]))
    stream.finish()
    return time.perf_counter() - started, stream.count


def report(name: str, size: int, seconds: list[float]) -> None:
    rates = [size / s / 1e6 for s in seconds]
    print(f"{name:44s} median {statistics.median(rates):8.0f} MB/s   min {min(rates):6.0f}   "
          f"max {max(rates):6.0f}   ({len(rates)} runs)")


def compare(redactor: Redactor, data: bytes) -> None:
    """The matchers measured before choosing (whole body at once, no streaming)."""
    secret_texts = texts(SECRET)
    compiled = [compile_text(t) for t in secret_texts]
    alternation = re.compile(b"|".join(c.full for c in compiled))
    started = time.perf_counter()
    alternation.subn(MARKER, data)
    report("compiled alternation (re.subn)", len(data), [time.perf_counter() - started])
    anchors = sorted({a for c in compiled for _, a in c.anchors})
    started = time.perf_counter()
    for anchor in anchors:
        data.find(anchor)
    report(f"bytes.find over {len(anchors)} anchors (prefilter only)", len(data),
           [time.perf_counter() - started])
    try:
        import ahocorasick  # type: ignore[import-not-found]  # pyahocorasick, if installed
    except ImportError:
        print("pyahocorasick not installed: skipped")
    else:
        automaton = ahocorasick.Automaton()
        for i, anchor in enumerate(anchors):
            automaton.add_word(anchor.decode("latin-1"), i)
        automaton.make_automaton()
        started = time.perf_counter()
        sum(1 for _ in automaton.iter(data.decode("latin-1")))
        report("pyahocorasick over the anchors (prefilter only)", len(data), [time.perf_counter() - started])
    started = time.perf_counter()
    redactor.redact(data)
    report("chosen: ahocorasick-rs prefilter + regex windows", len(data), [time.perf_counter() - started])


def sse(redactor: Redactor, count: int, repeat: int) -> None:
    """OpenAI-style chat.completion.chunk events, one per feed, a word each; one leak split in two."""
    rnd = random.Random(2)  # noqa: S311 - filler text, not a secret
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "streaming"]
    deltas = [" " + rnd.choice(words) for _ in range(count)]
    half = len(SECRET) // 2
    deltas[count // 2:count // 2 + 2] = [SECRET[:half].decode(), SECRET[half:].decode()]
    events = [b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                                      "choices": [{"index": 0, "delta": {"content": d}}]}).encode() + b"\n\n"
              for d in deltas]
    seconds = []
    for _ in range(repeat):
        stream = SseRedactor(redactor)
        started = time.perf_counter()
        for event in events:
            stream.feed(event)
        stream.finish()
        seconds.append(time.perf_counter() - started)
        if stream.count != 1:
            raise SystemExit(f"expected 1 redaction, got {stream.count}")
    rates = [count / s for s in seconds]
    name = f"sse: {count} chat.completion.chunk events"
    print(f"{name:44s} median {statistics.median(rates):8.0f} events/s   min {min(rates):6.0f}   "
          f"max {max(rates):6.0f}   ({len(rates)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,100", help="body sizes in MB (comma-separated)")
    parser.add_argument("--chunk", type=int, default=64 * 1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--every", type=int, default=200_000, help="bytes between two leaked forms")
    parser.add_argument("--body", choices=["api", "escapes"], default="api")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--sse", type=int, default=0, help="also stream this many SSE events")
    parser.add_argument("--smoke", action="store_true", help="1 MB, one run: checks the script works")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.repeat = "1", 1
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus, {cpu}")
    started = time.perf_counter()
    redactor = Redactor([SECRET], [b"Bearer " + SECRET])
    print(f"redactor built in {time.perf_counter() - started:.2f} s: {redactor!r}, "
          f"{len(forms(SECRET))} enumerated forms")
    for megabytes in (int(s) for s in args.sizes.split(",")):
        data, placed = body(megabytes, args.every, args.body == "escapes")
        seconds = []
        for _ in range(args.repeat):
            elapsed, count = stream_once(redactor, data, args.chunk)
            if count != placed:
                raise SystemExit(f"expected {placed} redactions, got {count}")
            seconds.append(elapsed)
        report(f"{args.body} body {megabytes} MB, {args.chunk // 1024} KiB chunks, {placed} leaks",
               len(data), seconds)
        if args.compare and megabytes == max(int(s) for s in args.sizes.split(",")):
            compare(redactor, data)
    if args.sse:
        sse(redactor, args.sse, args.repeat)


if __name__ == "__main__":
    main()
