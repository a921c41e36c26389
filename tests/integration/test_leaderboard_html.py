"""The leaderboard's HTML page in a real browser. On a fixture: headless Chromium loads it from disk (no network), its
tables are there with their ids and rows, a click-sort (driven by the page's `#sort=<table>:<column>` hook) reorders
rows, and a screenshot is taken. On the committed page: rendered again from the committed result files into a
temporary folder, it must equal results/tables/leaderboard.html and the Markdown pages byte for byte (the figures:
byte for byte under the matplotlib that drew them, else the same size), and Chromium opens the committed page and
screenshots it (not blank). Chromium comes from scripts/install_chromium.sh (a `make test` prerequisite); without it
the browser tests skip, unless CI is set, where a missing browser is a failure."""
from __future__ import annotations

import base64
import difflib
import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bpdbench.report import leaderboard, load, tables
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
        if exe is None and os.environ.get("CI", "").lower() not in ("", "0", "false"):
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


PNG_DATA = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


def committed_results(dest: Path) -> Path:
    """The result files git tracks (their working-tree content), copied to `dest`: the page is rendered from what is
    committed, not from a local run's untracked folders beside it."""
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "results"], capture_output=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout: the committed result files cannot be listed")
    for rel in filter(None, done.stdout.decode().split("\0")):
        if not rel.startswith("results/tables/"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, dest / rel)
    return dest / "results"


def png_software(data: bytes) -> str | None:
    """The PNG's tEXt "Software" entry (matplotlib writes its version there)."""
    at = 8
    while at < len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt" and data[at + 8:at + 8 + size].startswith(b"Software\0"):
            return data[at + 17:at + 8 + size].decode("latin-1")
        at += 12 + size
    return None


def same_figure(ours: bytes, committed: bytes, what: str) -> None:
    """Byte for byte when this matplotlib drew the committed figure; another version draws its own pixels, so then
    the same PNG size (IHDR) is what can be asked."""
    import matplotlib
    if ours == committed:
        return
    drawn_by = png_software(committed) or "unknown"
    assert f"version{matplotlib.__version__}," not in drawn_by, f"{what}: the figure differs; re-render"
    assert ours[16:24] == committed[16:24], f"{what}: figure size differs (drawn by {drawn_by})"


def same_text(ours: str, committed: str, what: str) -> None:
    diff = list(difflib.unified_diff(committed.splitlines(), ours.splitlines(), "committed", "rendered", n=0,
                                     lineterm=""))
    assert not diff, (f"{what} differs from a render of the committed result files (re-render with `bpdbench "
                      "tables` and commit): " + "\n".join(line[:300] for line in diff[:8]))


def test_the_committed_leaderboard_is_what_the_committed_results_render(tmp_path):
    results = committed_results(tmp_path / "checkout")
    commits = {f.environment.get("git_commit") for prefix in leaderboard.SPEED_AREAS
               for area in load.areas(results, prefix) for f in load.folders(results, area, "speed.csv")}
    unknown = sorted(c for c in commits if c and leaderboard.commit_time(c) is None)
    assert not unknown, (f"this checkout lacks the history of {len(unknown)} commit(s) the speed folders record "
                         f"({unknown[0][:12]}, ...): a board keeps its newest commit's folders by git history; "
                         "fetch it (`git fetch --unshallow`)")
    out = tmp_path / "rendered"
    out.mkdir()
    tables.leaderboard_files(results, out)
    committed = ROOT / "results" / "tables"
    pages = sorted(p.name for p in (committed / "leaderboard").iterdir())
    assert sorted(p.name for p in (out / "leaderboard").iterdir()) == pages, "the machine pages differ; re-render"
    for rel in ["leaderboard.md", "leaderboard.csv", *(f"leaderboard/{p}" for p in pages if p.endswith(".md"))]:
        same_text((out / rel).read_text(), (committed / rel).read_text(), rel)
    for rel in (f"leaderboard/{p}" for p in pages if p.endswith(".png")):
        same_figure((out / rel).read_bytes(), (committed / rel).read_bytes(), rel)
    ours, theirs = (out / "leaderboard.html").read_text(), (committed / "leaderboard.html").read_text()
    same_text(PNG_DATA.sub("PNG", ours), PNG_DATA.sub("PNG", theirs), "leaderboard.html")
    figures = list(zip(PNG_DATA.findall(ours), PNG_DATA.findall(theirs), strict=True))
    for i, (a, b) in enumerate(figures):
        same_figure(base64.b64decode(a), base64.b64decode(b), f"leaderboard.html figure {i + 1}")


def test_the_committed_leaderboard_in_headless_chromium(tmp_path):
    exe = chromium()
    page = ROOT / "results" / "tables" / "leaderboard.html"
    done = browse(exe, page.resolve().as_uri(), "--dump-dom", profile=tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    machines = sorted((ROOT / "results" / "tables" / "leaderboard").glob("*.md"))
    machines = [p for p in machines if not p.stem.endswith("-studies")]    # a machine's studies: its second page
    assert len(dom_tables(done.stdout)["machines"]) == len(machines)        # one index row per machine page

    from PIL import Image
    shot = tmp_path / "committed.png"
    done = browse(exe, page.resolve().as_uri(), f"--screenshot={shot}", "--window-size=1400,2000",
                  profile=tmp_path / "profile")
    assert shot.exists(), done.stderr[-2000:]
    with Image.open(shot) as img:
        assert img.size == (1400, 2000), img.size
        assert img.convert("RGB").getcolors(maxcolors=16) is None, "the screenshot is blank (16 colours or fewer)"
