"""Render a `llamabatch bench --html` report to PNG with headless Chromium, and check the picture.

Takes the report itself, or a `bench --json` document (then `bench --from-json --html` writes the
report first, no model loaded). Chromium draws the page at --width x --height CSS pixels (the
top of the page: header and the first charts at the default size) into --out. The check: the
file is a PNG of exactly that size whose pixels are not one flat colour (a page that failed to
draw is blank), under --max-kb. Prints one line per step. Needs Chromium (`apt-get install
chromium`); without it, says so and exits 2. Usage:

  python benchmarks/render_report.py (REPORT.html | BENCH.json) [--out report.png]
                                     [--width 1040] [--height 1700] [--max-kb 300]
"""
from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from _bench import llamabatch_command

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome-headless-shell")


def find_browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def screenshot(browser: str, page: Path, out: Path, width: int, height: int) -> None:
    """Headless Chromium, a throwaway profile, nothing fetched (the report needs nothing)."""
    with tempfile.TemporaryDirectory(prefix="render-report-") as profile:
        cmd = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={out}",
               page.resolve().as_uri()]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root (containers)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"chromium failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")


def png_facts(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the pixel rows) of a PNG. Raises ValueError."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    pixels = zlib.decompress(idat)
    return width, height, len(set(pixels))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a bench --html report, or a bench --json document")
    ap.add_argument("--out", default="report.png", help="the PNG to write (default: report.png)")
    ap.add_argument("--width", type=int, default=1040, help="CSS pixels (default: 1040)")
    ap.add_argument("--height", type=int, default=1700, help="CSS pixels from the top of the page (default: 1700)")
    ap.add_argument("--max-kb", type=int, default=300, help="fail above this file size (default: 300)")
    args = ap.parse_args()
    browser = find_browser()
    if browser is None:
        print("no Chromium found (apt-get install chromium): nothing rendered", file=sys.stderr)
        raise SystemExit(2)
    source, out = Path(args.source), Path(args.out)
    with tempfile.TemporaryDirectory(prefix="render-report-") as folder:
        page = source
        if source.suffix == ".json":
            page = Path(folder) / "report.html"
            proc = subprocess.run(llamabatch_command("bench", "--from-json", str(source), "--html", str(page)),
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise SystemExit(f"bench --from-json failed: {proc.stderr.strip()}")
            print(f"report written from {source}")
        screenshot(browser, page, out, args.width, args.height)
    data = out.read_bytes()
    width, height, distinct = png_facts(data)
    print(f"rendered {out} with {Path(browser).name}: {width} x {height} px, {len(data) / 1024:.0f} KB, "
          f"{distinct} distinct byte values in its pixels")
    problems = ([f"size {width} x {height}, asked for {args.width} x {args.height}"]
                if (width, height) != (args.width, args.height) else [])
    problems += ["the picture is one flat colour: the page did not draw"] if distinct < 16 else []
    problems += [f"{len(data) / 1024:.0f} KB is over --max-kb {args.max_kb}"] if len(data) > args.max_kb * 1024 else []
    if problems:
        raise SystemExit("check failed: " + "; ".join(problems))
    print("check passed")


if __name__ == "__main__":
    main()
