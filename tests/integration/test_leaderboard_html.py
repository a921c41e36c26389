"""The leaderboard's HTML page in a real browser: headless Chromium loads it from disk (no network), its tables are
there with their ids and rows, a click-sort (driven by the page's `#sort=<table>:<column>` hook) reorders rows, and a
screenshot is taken. Chromium comes from scripts/install_chromium.sh (a `make test` prerequisite); without it the
test skips, unless CI is set, where a missing browser is a failure."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bpdbench.report import leaderboard, tables
from tests.unit.test_leaderboard import EPYC, TIMES, XEON, speed_folder

ROOT = Path(__file__).resolve().parents[2]


def chromium() -> str:
    """The browser, installed by the project's script when missing; skip (CI unset) or fail (CI set) without it."""
    exe = shutil.which("chromium")
    if exe is None:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "install_chromium.sh")], capture_output=True,
                              text=True, timeout=1200)
        exe = shutil.which("chromium")
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        if exe is None and os.environ.get("CI"):
            pytest.fail(f"CI is set and chromium is missing: scripts/install_chromium.sh said: {why[0]}")
        if exe is None:
            pytest.skip(f"chromium is not installed and scripts/install_chromium.sh could not install it ({why[0]}); "
                        "CI is unset, so this is a skip, not a failure")
    return exe


def browse(exe: str, url: str, *args: str, profile: Path) -> subprocess.CompletedProcess:
    sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []          # Chromium refuses its sandbox as root
    return subprocess.run([exe, "--headless", "--disable-gpu", "--hide-scrollbars", *sandbox,
                           f"--user-data-dir={profile}", *args, url], capture_output=True, text=True, timeout=180)


class Tables(HTMLParser):
    """Each table's id -> its body rows' cell texts (and its header rows' cell counts), from the DOM Chromium
    dumped."""
    def __init__(self):
        super().__init__()
        self.found: dict[str, list[list[str]]] = {}
        self.header: dict[str, list[int]] = {}
        self._id, self._row, self._cell, self._body = None, None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._id = a.get("id")
            self.found[self._id], self.header[self._id] = [], []
        elif tag == "tr" and not self._body:
            self.header[self._id].append(0)
        elif tag == "th" and not self._body:
            self.header[self._id][-1] += 1
        elif tag == "tbody":
            self._body = True
        elif tag == "tr" and self._body:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.found[self._id].append(self._row)
            self._row = None
        elif tag == "tbody":
            self._body = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def dom_tables(text: str) -> dict[str, list[list[str]]]:
    """Body rows per table id; every table must have one header row as wide as its rows (no index levels)."""
    p = Tables()
    p.feed(text)
    for table_id, rows in p.found.items():
        assert len(p.header[table_id]) == 1 and all(len(r) == p.header[table_id][0] for r in rows), table_id
    return p.found


def test_leaderboard_html_in_headless_chromium(tmp_path, monkeypatch):
    exe = chromium()
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c))
    results = tmp_path / "results"
    speed_folder(results, "spec_bench", XEON, speedups={f"m{i}": 0.7 + 0.1 * i for i in range(8)})
    speed_folder(results, "spec_bench-epyc", EPYC, counts=True)
    out = results / "tables"
    out.mkdir()
    page = next(p for p in tables.leaderboard_files(results, out) if p.suffix == ".html")
    url = page.resolve().as_uri()

    done = browse(exe, url, "--dump-dom", profile=tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    found = dom_tables(done.stdout)
    speed = "f48c4d64e244-spec_bench-m-0.5b-bfloat16-speed"
    for table_id, rows in {"machines": 2, speed: 9, "f48c4d64e244-spec_bench-m-0.5b-bfloat16-which": 8,
                           "afcf1aeb72d2-spec_bench-m-0.5b-bfloat16-accept": 3}.items():
        assert len(found.get(table_id, [])) == rows, (table_id, found.get(table_id))
    assert [r[1] for r in found[speed]][0] == "m7"                    # ranked by speedup as written
    assert 'src="data:image/png;base64,' in done.stdout and "<script" in done.stdout

    done = browse(exe, f"{url}#sort={speed}:2", "--dump-dom", profile=tmp_path / "profile")
    sorted_rows = dom_tables(done.stdout)[speed]                      # one click on "speedup": ascending
    speedups = [float(re.match(r"[\d.]+", r[2]).group()) for r in sorted_rows]
    assert speedups == sorted(speedups) and sorted_rows[0][1] == "m0"

    shot = tmp_path / "leaderboard.png"
    done = browse(exe, url, f"--screenshot={shot}", "--window-size=1400,2000", profile=tmp_path / "profile")
    assert shot.exists() and shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000, done.stderr[-2000:]
