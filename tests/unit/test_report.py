"""The rollout report (src/vllm_fleet/report.py): one self-contained HTML page per run.

Built from the recorded-looking runs under tests/fixtures/reports/ (written by its
generate.py with the real soak Monitor and verdict): a halted rollout (the canary crashed
~40 s into its soak with the CUDA error and was rolled back), a converged one (three nodes
upgraded after passing soaks, one skipped) and a wedge. The HTML is checked as text, then
rendered by headless Chromium (Debian's `chromium`, installed by scripts/setup-host.sh):
the screenshot is decoded here (zlib + struct, no imaging library) and the verdict badges,
the plot lines and the crash/wedge markers must show as pixels of their colours inside the
boxes Chromium laid out for them.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import pytest

from tests.unit.test_cli import local_inventory, project, run_cli  # noqa: F401 -- `project` is a fixture
from vllm_fleet import cli
from vllm_fleet import report as rep

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reports"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WINDOW = (1400, 2400)


def scenario(tmp_path: Path, name: str) -> tuple[Path, dict]:
    """A copy of a fixture run (artifacts dir) and its summary."""
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest, json.loads((dest / "summary.json").read_text())


def build(tmp_path: Path, name: str, mutate=None) -> tuple[Path, str]:
    art, summary = scenario(tmp_path, name)
    if mutate:
        mutate(art / "reports", summary)
    path = rep.build_report(art / "reports", art / "rollout.html", summary)
    return path, path.read_text(encoding="utf-8")


def soak_dirs(report_dir: Path) -> list[Path]:
    return sorted(report_dir.glob("rollout/*/soak/*"))


# ---------------------------------------------------------------- the page, as text

def test_halted_rollout_names_the_canary_its_crash_and_the_untouched_nodes(tmp_path):
    path, text = build(tmp_path, "halted")
    assert path == tmp_path / "halted" / "rollout.html"
    assert 'data-outcome="halted"' in text and ">HALTED<" in text
    assert "Halted: gpu-node-01 failed its soak gate and was rolled back to vllm-0.24.2_nvidia-cudnn-cu13-9.19.0.56" \
        in text
    assert "3 node(s) after it were not touched" in text
    rows = dict(re.findall(r'<tr class="node" data-host="([^"]+)" data-status="([^"]+)"', text))
    assert rows == {"gpu-node-01": "rolled_back", "gpu-node-02": "not_reached", "gpu-node-03": "not_reached",
                    "gpu-node-04": "not_reached"}
    # the evidence: the CUDA error from the journal, with the crash time
    assert "The engine crashed 40.0 s into the soak (cuda_error): torch.AcceleratorError: CUDA error: an illegal " \
           "memory access was encountered" in text
    assert "vllm.v1.engine.exceptions.EngineDeadError" in text
    # one soak card, three plots, the crash marked on each
    assert text.count('class="card soak"') == 1
    plots = re.findall(r'<svg class="plot" data-plot="([^"]+)"', text)
    assert [p.rsplit("-", 1)[1] for p in plots] == ["tokens", "kv", "running"]
    assert text.count('<g class="marker crash">') == 3 and "crash 40 s" in text
    assert 'class="marker wedge"' not in text
    # what the failed soak proved, and the preflight's accepted risk that led here
    assert "What it proved:</b> The soak failed (crash): it proves nothing about the crash rate." in text
    assert "A failed soak cannot show MTBF &gt;= 8 h" in text and "crash rate is below" not in text
    assert "accepted blocker cudnn-sm12x-fusion-matmul-oob" in text
    assert "try torch&#x27;s own cuDNN pin on the canary" in text
    assert "vllm-fleet rollout: <b>gate_failed</b> (exit 4)" in text


def test_a_wedged_soak_claims_no_proof_in_the_report(tmp_path):
    _, text = build(tmp_path, "wedge")
    assert "The soak failed (wedge): it proves nothing about the crash rate." in text
    assert "Zero crashes" not in text and "MTBF above" not in text


def test_the_soak_card_shows_both_throughputs_and_which_the_gate_used(tmp_path):
    def bench_figures(reports, _summary):
        for path in soak_dirs(reports):
            verdict = json.loads((path / "verdict.json").read_text())
            verdict.update(tokens_per_s=14210.0, bench_tokens_per_s=14388.0,
                           throughput={"gate_used": "bench_totals", "recomputed": 14210.0, "reported": 14388.0})
            (path / "verdict.json").write_text(json.dumps(verdict))

    _, text = build(tmp_path, "converged", bench_figures)
    assert text.count("<b>14,210</b> tokens/s (recomputed from the runs&#x27; token totals, judged by the gate); "
                      "the bench reported <b>14,388</b> tokens/s") == 4
    # No load run finished (the crashed canary): the server's count only, nothing invented.
    _, halted = build(tmp_path / "plain", "halted")
    assert "the bench reported" not in halted and "(the server&#x27;s own count, judged by the gate)" in halted


def test_converged_rollout_shows_every_soak_with_its_proof(tmp_path):
    _, text = build(tmp_path, "converged")
    assert 'data-outcome="converged"' in text
    assert "Every node serves vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43: 3 upgraded, 1 already on it (skipped)." in text
    rows = dict(re.findall(r'<tr class="node" data-host="([^"]+)" data-status="([^"]+)"', text))
    assert rows == {"gpu-node-01": "upgraded", "gpu-node-02": "upgraded", "gpu-node-03": "upgraded",
                    "gpu-node-04": "skipped"}
    cards = re.findall(r'<div class="card soak" id="[^"]+" data-host="([^"]+)" data-instance="([^"]+)"', text)
    assert cards == [("gpu-node-01", "gpu0"), ("gpu-node-02", "gpu0"), ("gpu-node-03", "gpu0"),
                     ("gpu-node-03", "gpu1")]
    assert text.count('<svg class="plot"') == 12
    assert text.count("soak soak-passed") == 3 + 4  # the node table's three, each card's own
    assert "marker crash" not in text and "marker wedge" not in text
    assert text.count("What it proved:</b> Zero crashes in 50.0 min of load: the crash rate is below 0.05991/min "
                      "(MTBF above 0.278 h) at 95% confidence.") == 4
    assert "Not long enough for MTBF &gt;= 8 h at 95%: that needs 1438 min without a crash" in text
    # a 50-minute soak is plotted in minutes; every series is drawn
    assert "elapsed (min)" in text
    for series in ("tokens/s", "KV cache", "running", "waiting"):
        assert text.count(f'data-series="{series}"') == 4
    # each soak links from the node table
    for anchor in re.findall(r'<a href="#([^"]+)">gpu[01]</a>', text):
        assert f'id="{anchor}"' in text


def test_wedge_is_marked_from_when_progress_stopped_to_its_detection(tmp_path):
    _, text = build(tmp_path, "wedge")
    assert 'data-outcome="halted"' in text
    assert text.count('<g class="marker wedge">') == 3
    assert text.count('class="marker-span wedge"') == 3
    assert "wedge 5.0 min" in text
    assert "The engine wedged 302.0 s into the soak: 12 request(s) in flight and no progress for 60 s" in text
    assert "1 node(s) after it were not touched" in text


def test_the_page_is_self_contained(tmp_path):
    for name in ("halted", "converged", "wedge"):
        _, text = build(tmp_path, name)
        lowered = text.lower()
        for forbidden in ("<script", "<link", "<img", "<iframe", "src=", "url(", "@import", "https://"):
            assert forbidden not in lowered, (name, forbidden)
        assert set(re.findall(r"https?://[^\s\"'<]+", text)) <= {"http://www.w3.org/2000/svg",
                                                              "http://127.0.0.1:8000"}
        assert text.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in text


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_hostile_text_from_reports_is_escaped(tmp_path):
    def mutate(report_dir: Path, summary: dict):
        path = report_dir / "rollout" / "gpu-node-01.json"
        data = json.loads(path.read_text())
        data["message"] = f"soak gate failed {HOSTILE}"
        data["failed_task"] = HOSTILE
        data["target"] = f"vllm-{HOSTILE}"
        data["soak"]["reasons"] = [f"reason {HOSTILE}"]
        path.write_text(json.dumps(data))
        verdict_path = soak_dirs(report_dir)[0] / "verdict.json"
        verdict = json.loads(verdict_path.read_text())
        verdict["summary"] = f"Soak failed: {HOSTILE}"
        verdict["crashes"][0]["journal"].append(f"</pre>{HOSTILE}")
        verdict["crashes"][0]["kind"] = HOSTILE
        verdict["proof"]["statement"] = HOSTILE
        verdict_path.write_text(json.dumps(verdict))
        pre = json.loads((report_dir / "preflight.json").read_text())
        pre["gpu-node-02"]["report"]["summary"].append(HOSTILE)
        (report_dir / "preflight.json").write_text(json.dumps(pre))
        summary["message"] = HOSTILE

    _, text = build(tmp_path, "halted", mutate)
    lowered = text.lower()
    assert "<script" not in lowered and "<img" not in lowered and "</pre><script" not in lowered
    assert text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 8


def test_missing_and_garbled_files_become_notes_not_crashes(tmp_path):
    def mutate(report_dir: Path, summary: dict):
        soak = soak_dirs(report_dir)[0]
        lines = (soak / "progress.jsonl").read_text().splitlines()
        lines[5] = lines[5][:40]  # a line cut short
        lines.insert(9, "\x00\x01 not json")
        lines.append('{"elapsed_s": "soon"}')
        (soak / "progress.jsonl").write_text("\n".join(lines) + "\n")
        (soak / "verdict.json").write_text('{"passed": fal')  # cut short while being copied
        (report_dir / "rollout" / "gpu-node-09.json").write_text("{not json")
        # a node whose report is not a mapping, and one whose soak files came without a report
        (report_dir / "rollout" / "gpu-node-08.json").write_text("[1, 2]")
        shutil.copytree(soak, report_dir / "rollout" / "gpu-node-07" / "soak" / soak.name)

    _, text = build(tmp_path, "halted", mutate)
    assert "rollout/gpu-node-01/soak/20261202T140733Z-gpu0/progress.jsonl: 3 line(s) could not be read" in text
    assert "verdict.json could not be read" in text
    assert "the verdict shown is the one in the rollout report" in text
    assert "unreadable report gpu-node-09.json" in text
    assert "rollout/gpu-node-08.json is not a mapping" in text
    # the verdict from the rollout report still marks the crash on the plots
    assert text.count('<g class="marker crash">', 0, text.index('data-host="gpu-node-07" data-instance')) == 3
    # the orphan soak is shown (status unknown), its crash counted from its progress lines
    assert 'data-host="gpu-node-07" data-status="unknown"' in text
    assert text.count('class="card soak"') == 2 and text.count('<g class="marker crash">') == 6


def test_a_soak_without_any_verdict_still_plots_and_marks_from_its_progress(tmp_path):
    def mutate(report_dir: Path, summary: dict):
        (soak_dirs(report_dir)[0] / "verdict.json").unlink()
        path = report_dir / "rollout" / "gpu-node-01.json"
        data = json.loads(path.read_text())
        data["soak"] = None  # the gate never reported (the run was cut)
        path.write_text(json.dumps(data))

    _, text = build(tmp_path, "wedge", mutate)
    assert "verdict.json is missing" in text and "no verdict for this soak" in text
    assert text.count('<g class="marker wedge">') == 3  # from the wedges counter in progress.jsonl
    assert text.count('data-series="tokens/s"') == 1


def test_soak_files_that_were_not_fetched_are_said(tmp_path):
    def mutate(report_dir: Path, summary: dict):
        shutil.rmtree(report_dir / "rollout" / "gpu-node-01")

    _, text = build(tmp_path, "halted", mutate)
    assert "the soak&#x27;s files were not fetched to rollout/gpu-node-01/soak/: no plots" in text
    assert "no samples" in text
    assert text.count('<g class="marker crash">') == 3  # the verdict still knows when


def test_blocked_and_empty_runs(tmp_path):
    report_dir = tmp_path / "blocked" / "reports"
    report_dir.mkdir(parents=True)
    pre = json.loads((FIXTURES / "halted" / "reports" / "preflight.json").read_text())
    entry = pre["gpu-node-02"]
    entry["report"] = {"verdict": "block", "summary": ["verdict: block (1 blocker(s))"],
                       "message": "preflight blocked the rollout: 1 known issue(s) in the planned config."}
    (report_dir / "preflight.json").write_text(json.dumps({"gpu-node-01": pre["gpu-node-01"],
                                                           "gpu-node-02": entry}))
    text = rep.build_report(report_dir).read_text()
    assert (report_dir / "rollout.html").is_file()
    assert 'data-outcome="blocked"' in text
    assert "Preflight blocked the rollout on gpu-node-02: no node was touched." in text
    assert "preflight blocked the rollout: 1 known issue(s)" in text

    empty = tmp_path / "empty"
    empty.mkdir()
    text = rep.build_report(empty).read_text()
    assert 'data-outcome="empty"' in text and "No rollout or preflight report" in text
    text = rep.build_report(tmp_path / "missing", tmp_path / "m.html").read_text()
    assert "is not a directory" in text


# ---------------------------------------------------------------- the plot helper

def test_ticks_and_axis_tops_are_round_numbers():
    assert rep.nice_max(14286) == 15000 and rep.nice_max(0.3) == 0.3 and rep.nice_max(0) == 1.0
    assert rep.nice_max(32) == 40 and rep.nice_max(100) == 100
    assert rep.ticks(0, 100, 4) == [0, 25, 50, 75, 100]
    assert rep.ticks(0, 50, 6) == [0, 10, 20, 30, 40, 50]


def test_decimate_keeps_spikes_and_gaps():
    points = [(float(i), 10.0) for i in range(5000)]
    points[1234] = (1234.0, 0.0)  # one dip to zero
    points[4000] = (4000.0, None)  # one unreadable tick
    thin = rep.decimate(points, 600)
    assert len(thin) <= 620
    assert (1234.0, 0.0) in thin and any(p[1] is None for p in thin)
    assert [p[0] for p in thin] == sorted(p[0] for p in thin)
    assert rep.decimate(points[:10], 600) == points[:10]


def test_line_plot_draws_segments_markers_and_an_empty_state():
    series = [rep.Series("tokens/s", "#123456", [(0, 1.0), (10, 2.0), (20, None), (30, 3.0), (40, 4.0)])]
    svg = rep.line_plot("t <&> t", series, x_max=40, markers=[
        rep.Marker(25, "crash", "crash 25 s", detail="CUDA error <x>"),
        rep.Marker(30, "wedge", "wedge 30 s", x_end=38)])
    path = re.search(r'<path class="series"[^>]* d="([^"]+)"', svg).group(1)
    assert path.count("M") == 2 and path.count("L") == 2  # the gap splits the line
    assert 'stroke="#123456"' in svg
    assert "t &lt;&amp;&gt; t" in svg and "CUDA error &lt;x&gt;" in svg
    assert '<g class="marker crash">' in svg and 'class="marker-span wedge"' in svg
    assert "elapsed (s)" in svg
    empty = rep.line_plot("x", [rep.Series("x", "#000000", [(0, None)])], x_max=0)
    assert "no samples" in empty and "<path" not in empty


# ---------------------------------------------------------------- the CLI

def test_cli_report_rebuilds_the_page_from_an_artifacts_dir(tmp_path):
    art, _ = scenario(tmp_path, "wedge")
    code, out = run_cli("report", str(art))
    assert code == 0
    assert out.strip() == str(art / "rollout.html")
    text = (art / "rollout.html").read_text()
    assert "vllm-fleet rollout: <b>gate_failed</b> (exit 4)" in text  # from summary.json
    code, out = run_cli("report", str(art / "reports"), "-o", str(tmp_path / "x" / "r.html"))
    assert code == 0 and (tmp_path / "x" / "r.html").is_file()
    assert "gate_failed" not in (tmp_path / "x" / "r.html").read_text()  # a bare report dir: no summary


def test_cli_report_of_a_missing_dir_is_a_usage_error(tmp_path, capsys):
    code, _ = run_cli("report", str(tmp_path / "nope"))
    assert code == 2 and "not a directory" in capsys.readouterr().err


def test_cli_rollout_writes_the_page_and_names_it_in_the_summary(project, tmp_path):  # noqa: F811
    local_inventory(project / "inventory.json", {"canary": {"soak_fails": True}, "node2": {}})
    art = tmp_path / "run"
    code, out = run_cli("rollout", "--project-dir", str(project), "--artifacts", str(art))
    assert code == 4, out
    summary = json.loads((art / "summary.json").read_text())
    assert summary["report_html"] == str(art / "rollout.html")
    assert f"report: {art / 'rollout.html'}" in out
    text = (art / "rollout.html").read_text()
    assert 'data-outcome="halted"' in text and 'data-host="canary" data-status="rolled_back"' in text
    assert "engine died at 23 min" in text

    code, out = run_cli("preflight", "--project-dir", str(project), "--artifacts", str(tmp_path / "pre"))
    assert code == 0, out
    assert json.loads((tmp_path / "pre" / "summary.json").read_text())["report_html"] is None
    assert not (tmp_path / "pre" / "rollout.html").exists()


def test_a_report_that_cannot_be_written_does_not_change_the_runs_result(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.write_html_report(tmp_path, blocker / "rollout.html", None) is None
    assert "cannot write the HTML report" in capsys.readouterr().err


# ---------------------------------------------------------------- rendered by Chromium

def chromium(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="vf-chromium-")
    try:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={profile}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", *args],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": profile})
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, rows) of an 8-bit RGB/RGBA non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, prev = [], bytes(stride)
    low7, high = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
    for y in range(height):
        kind, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        if kind == 0:
            row = line
        elif kind == 2:  # Up: bytewise add without carries, on the whole row at once
            a, b = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
            row = (((a & low7) + (b & low7)) ^ ((a ^ b) & high)).to_bytes(stride, "big")
        else:
            out = bytearray(line)
            for i in range(stride):
                left = out[i - bpp] if i >= bpp else 0
                if kind == 1:
                    out[i] = (out[i] + left) & 0xFF
                elif kind == 3:
                    out[i] = (out[i] + ((left + prev[i]) >> 1)) & 0xFF
                else:  # Paeth
                    up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                    out[i] = (out[i] + pred) & 0xFF
            row = bytes(out)
        rows.append(row)
        prev = row
    return width, height, bpp, rows


def hex_rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


class Screenshot:
    def __init__(self, png: Path):
        self.width, self.height, self.bpp, self.rows = decode_png(png.read_bytes())

    def count(self, color: str, box: tuple[float, float, float, float] | None = None, tol: int = 10) -> int:
        """Pixels within ``tol`` (per channel) of ``color`` inside ``box`` (x, y, w, h), else anywhere."""
        r0, g0, b0 = hex_rgb(color)
        x, y, w, h = box or (0, 0, self.width, self.height)
        x0, y0 = max(0, int(x)), max(0, int(y))
        x1, y1 = min(self.width, int(x + w)), min(self.height, int(y + h))
        n, bpp = 0, self.bpp
        for row in self.rows[y0:y1]:
            for i in range(x0 * bpp, x1 * bpp, bpp):
                if abs(row[i] - r0) <= tol and abs(row[i + 1] - g0) <= tol and abs(row[i + 2] - b0) <= tol:
                    n += 1
        return n

    def tallest_column(self, color: str, box: tuple[float, float, float, float], tol: int = 10) -> int:
        """The most pixels of ``color`` in one column of ``box``: a vertical marker line, not its label."""
        r0, g0, b0 = hex_rgb(color)
        x, y, w, h = box
        x0, x1 = max(0, int(x)), min(self.width, int(x + w))
        columns = [0] * max(0, x1 - x0)
        for row in self.rows[max(0, int(y)):min(self.height, int(y + h))]:
            for n, i in enumerate(range(x0 * self.bpp, x1 * self.bpp, self.bpp)):
                if abs(row[i] - r0) <= tol and abs(row[i + 1] - g0) <= tol and abs(row[i + 2] - b0) <= tol:
                    columns[n] += 1
        return max(columns, default=0)

    def colors(self, step: int = 7) -> int:
        return len({row[i:i + 3] for row in self.rows[::step] for i in range(0, len(row), self.bpp * step)})


# Where Chromium lays things out: the same page with a script that records the boxes,
# read back with --dump-dom (the screenshot is taken of the page as shipped, no script).
LAYOUT_SCRIPT = """<script>
const boxes = {};
const put = (key, el) => { const r = el.getBoundingClientRect(); boxes[key] = [r.x, r.y, r.width, r.height]; };
document.querySelectorAll('svg.plot').forEach(el => put('plot:' + el.dataset.plot, el));
document.querySelectorAll('.badge').forEach((el, i) => put('badge:' + i + ':' + el.className, el));
document.querySelectorAll('tr.node').forEach(el => put('row:' + el.dataset.host, el));
document.documentElement.setAttribute('data-boxes', JSON.stringify(boxes));
</script>"""


def render(page: Path) -> tuple[Screenshot, dict, float]:
    started = time.monotonic()
    probe = page.with_name("layout-probe.html")
    probe.write_text(page.read_text().replace("</body>", LAYOUT_SCRIPT + "</body>"))
    dom = chromium("--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    match = re.search(r'data-boxes="([^"]*)"', dom.stdout)
    assert match, dom.stdout[:500]
    boxes = json.loads(html.unescape(match.group(1)))
    png = page.with_suffix(".png")
    shot = chromium(f"--screenshot={png}", page.as_uri())
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    return Screenshot(png), boxes, time.monotonic() - started


def visible(box, shot: Screenshot) -> bool:
    x, y, w, h = box
    return w > 0 and h > 0 and y >= 0 and y + h <= shot.height


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup-host.sh "
                                                              "installs Debian's chromium)")


@needs_chromium
def test_chromium_renders_the_halted_report_with_its_verdicts_and_plots(tmp_path):
    page, _ = build(tmp_path, "halted")
    shot, boxes, took = render(page)
    print(f"chromium: layout + screenshot in {took:.1f} s")
    assert (shot.width, shot.height) == WINDOW
    assert shot.colors() > 50, "the screenshot is (nearly) blank"
    # the outcome badge and the canary's rolled-back and failed badges, in red, where laid out
    outcome = next(v for k, v in boxes.items() if "outcome-halted" in k)
    assert shot.count(rep.OUTCOME_COLORS["halted"], outcome, tol=3) > 0.5 * outcome[2] * outcome[3]
    canary = boxes["row:gpu-node-01"]
    rolled = next(v for k, v in boxes.items() if "status-rolled_back" in k)
    assert canary[1] <= rolled[1] <= canary[1] + canary[3]
    assert shot.count(rep.STATUS_COLORS["rolled_back"], rolled, tol=3) > 0.5 * rolled[2] * rolled[3]
    failed = next(v for k, v in boxes.items() if "soak-failed" in k)
    assert shot.count(rep.VERDICT_COLORS["failed"], failed, tol=3) > 0.4 * failed[2] * failed[3]
    # the three plots: each its line colour inside its own box, and the crash marker in each
    plots = {k.rsplit("-", 1)[1]: v for k, v in boxes.items() if k.startswith("plot:")}
    assert set(plots) == {"tokens", "kv", "running"}
    for kind, box in plots.items():
        assert visible(box, shot) and box[2] > 300 and box[3] > 150, (kind, box)
        color = rep.PLOT_COLORS[kind]
        assert shot.count(color, box) > 60, (kind, "line not drawn")
        # the marker: a full-height vertical line (its label alone is a few pixels a column)
        assert shot.tallest_column(rep.MARKER_COLORS["crash"], box) > 0.55 * box[3], (kind, "no crash marker")
    # a plot's line colour shows nowhere but in its plot
    everywhere = shot.count(rep.PLOT_COLORS["kv"])
    assert everywhere == shot.count(rep.PLOT_COLORS["kv"], plots["kv"])


@needs_chromium
def test_chromium_renders_the_converged_report_every_soak_plotted(tmp_path):
    page, _ = build(tmp_path, "converged")
    shot, boxes, took = render(page)
    print(f"chromium: layout + screenshot in {took:.1f} s")
    outcome = next(v for k, v in boxes.items() if "outcome-converged" in k)
    assert shot.count(rep.OUTCOME_COLORS["converged"], outcome, tol=3) > 0.5 * outcome[2] * outcome[3]
    for host in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
        row = boxes[f"row:{host}"]
        badge = next(v for k, v in boxes.items() if "status-upgraded" in k and row[1] <= v[1] <= row[1] + row[3])
        assert shot.count(rep.STATUS_COLORS["upgraded"], badge, tol=3) > 0.5 * badge[2] * badge[3]
    skipped = next(v for k, v in boxes.items() if "status-skipped" in k)
    assert shot.count(rep.STATUS_COLORS["skipped"], skipped, tol=3) > 0.5 * skipped[2] * skipped[3]
    plots = {k: v for k, v in boxes.items() if k.startswith("plot:")}
    assert len(plots) == 12
    shown = [k for k, v in plots.items() if visible(v, shot)]
    assert len(shown) >= 9, "the soaks do not fit the 2400-pixel window any more"
    for key in shown:
        kind = key.rsplit("-", 1)[1]
        assert shot.count(rep.PLOT_COLORS[kind], plots[key]) > 200, key
        assert shot.count(rep.MARKER_COLORS["crash"], plots[key]) == 0, key
    if os.environ.get("VF_REPORT_SCREENSHOT_DIR"):  # keep the picture (docs/img)
        shutil.copy(page.with_suffix(".png"), Path(os.environ["VF_REPORT_SCREENSHOT_DIR"]) / "converged.png")


@needs_chromium
def test_chromium_renders_the_wedge_marker(tmp_path):
    page, _ = build(tmp_path, "wedge")
    shot, boxes, _ = render(page)
    plots = {k.rsplit("-", 1)[1]: v for k, v in boxes.items() if k.startswith("plot:")}
    for kind, box in plots.items():
        assert shot.count(rep.PLOT_COLORS[kind], box) > 60, kind
        assert shot.tallest_column(rep.MARKER_COLORS["wedge"], box) > 0.3 * box[3], (kind, "no wedge marker")
        assert shot.count(rep.MARKER_COLORS["crash"], box) == 0, kind
