"""The benchmark harness works (not how fast anything is): its smoke mode against a real stack,
and the pieces that must be right for its figures to mean anything."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import docfile
from bench.egress_report import egress, gateway_before
from bench.loadgen import Dechunker, read_response
from bench.soak import slope
from bench.srt import find_srt
from bench.targets import EGRESS_GOALS
from bench.tools import find_mitmdump, find_nginx, find_wrk

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
@pytest.mark.parametrize("skip", [pytest.param("", id="tools-found"), pytest.param("all", id="no-tools")])
def test_smoke_run_measures_direct_and_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skip: str) -> None:
    """Whatever tools the machine has (CI may have none), direct and gateway rows run."""
    monkeypatch.setenv("VALETKEY_BENCH_SKIP", skip)
    out, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench.run", "--smoke", "--out", str(out), "--json", str(raw)],
                          cwd=REPO, capture_output=True, text=True, timeout=580, check=False, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(raw.read_text())
    proxy = results["proxy"]["raw"]
    for name in ("direct", "gateway-1"):
        for kind in ("small", "medium"):
            cell = proxy[name][kind]
            assert cell["rps"][0] > 0, (name, kind, cell)
            assert cell["p50"][0] > 0, (name, kind, cell)
    skipped = " ".join(results["skipped"])
    for tool, finder in (("nginx", find_nginx), ("mitmproxy", find_mitmdump)):
        assert (tool in proxy) == (finder() is not None)
        if finder() is None:
            assert f"{tool}: not installed" in skipped
    assert results["proxy"]["generator"] == ("wrk" if find_wrk() else "python closed loop")
    assert results["sse"]["gateway"]["count"] == 5
    assert results["tokens"]["verify_distinct_per_s"][0] > 0
    assert results["tokens"]["mint_per_s"][0] > 0
    assert [r["replicas"] for r in results["revocation"]] == [1]
    assert results["memory"]["gateway_1_idle"] > 0
    egress_raw = results["egress"]["raw"]
    for name in ("direct", "valetkey-terminate", "valetkey-tunnel"):
        for kind in ("small", "medium"):
            assert egress_raw[name][kind]["rps"][0] > 0, (name, kind)
            assert egress_raw[name][kind]["p50"][0] > 0, (name, kind)
    assert results["egress"]["bulk"]["valetkey-tunnel"]["mb_per_s"][0] > 0
    assert results["egress"]["mint"]["fresh_ms"] > 0
    assert ("mitmproxy-terminate" in egress_raw) == (find_mitmdump() is not None)
    assert ("srt-terminate" in egress_raw) == (find_srt() is not None)
    if find_srt() is not None:
        assert results["egress"]["srt_manager_error"]  # why SandboxManager did not start it (or that it did)
    text = out.read_text()
    for heading in ("## Targets (issue 6)", "## 1. Injection proxy overhead", "## 2. Server-sent events",
                    "## 3. Redaction throughput", "## 4. Tokens", "## 5. Revocation", "## 6. Memory",
                    "## 7. Egress proxy (issue 15)", "### Bulk through a tunnel", "### Leaf certificates"):
        assert heading in text


@pytest.mark.timeout(300)
def test_soak_samples_and_reports(tmp_path: Path) -> None:
    raw = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--minutes", "0.1", "--rate", "20", "--interval",
                           "1", "--json", str(raw)], cwd=REPO, capture_output=True, text=True, timeout=280,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(raw.read_text())
    assert len(result["timeline"]) >= 3
    assert result["gateway"]["max"] > 0
    assert result["requests"]["small"] > 0
    assert "## Soak" in done.stdout


def test_splice_keeps_the_other_sections(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    docfile.splice(doc, "run", "## 1. generated")
    assert "## Redaction" in doc.read_text()
    doc.write_text(doc.read_text().replace("its section goes here.", "1 GB/s, measured by hand."))
    docfile.splice(doc, "run", "## 1. regenerated")
    docfile.splice(doc, "soak", "## Soak\n\nflat")
    text = doc.read_text()
    assert "## 1. regenerated" in text
    assert "## 1. generated\n" not in text
    assert "1 GB/s, measured by hand." in text
    assert text.index("## Soak") < text.index("## Redaction")


def test_splice_into_a_file_without_markers(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Redaction\n\ntheirs\n")
    docfile.splice(doc, "run", "## Targets")
    text = doc.read_text()
    assert text.index("## Targets") < text.index("## Redaction")
    assert text.endswith("theirs\n")


@pytest.mark.parametrize("cuts", [pytest.param([1000], id="whole"), pytest.param([3, 5, 9, 40], id="split")])
def test_dechunker_reassembles_any_split(cuts: list[int]) -> None:
    wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n"
    decoder, out, pos = Dechunker(), b"", 0
    for cut in [*cuts, len(wire)]:
        out += decoder.feed(wire[pos:cut])
        pos = max(pos, min(cut, len(wire)))
    assert out == b"hello, world"


@pytest.mark.parametrize(("wire", "status", "body"), [
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", id="length"),
    pytest.param(b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 401,
                 b"{}", id="chunked"),
    pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", id="empty"),
])
def test_read_response(wire: bytes, status: int, body: bytes) -> None:
    async def parse() -> tuple[int, bytes, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(wire)
        reader.feed_eof()
        return await read_response(reader)

    got_status, _, got_body = asyncio.run(parse())
    assert (got_status, got_body) == (status, body)


def test_slope_is_mb_per_minute() -> None:
    assert slope([(0, 10.0), (60, 11.0), (120, 12.0)]) == pytest.approx(1.0)
    assert slope([(0, 10.0), (300, 10.0)]) == 0.0


def test_gateway_before_reads_table_1_of_the_committed_doc() -> None:
    before = gateway_before(REPO / "docs" / "benchmarks.md")
    assert set(before) >= {"p50_added_small", "vs_mitmproxy_small", "date"}


def test_egress_section_without_the_valetkey_proxy_says_why() -> None:
    """Rows missing (the proxy did not start) render as 'not measured' with the reason, never a crash."""
    cell = {"rps": [100.0], "p50": [1.0], "p99": [2.0], "cpu_ms": [0.1], "rss_peak": [50.0]}
    results = {"egress": {
        "plan": {"rounds": 1, "seconds": 1, "connections": 2, "latency_seconds": 1,
                 "rates": {"small": 20.0, "medium": 10.0}, "bulk_mb": 4, "bulk_rounds": 1},
        "raw": {"direct": {"small": cell, "medium": cell}}, "labels": {"direct": "direct TLS (no proxy)"},
        "bulk": {"direct": {"mb_per_s": [300.0], "mb_per_cpu_s": []}},
        "bulk_labels": {"direct": "direct TLS (no proxy)"},
        "mint": {"todo": "proxy/certs.py is not in this checkout"},
        "valetkey_missing": "the valetkey proxy did not start: boom"}}
    text = egress(results)
    assert "valetkey proxy rows missing**: the valetkey proxy did not start: boom" in text
    assert text.count("not measured") == len(EGRESS_GOALS)
