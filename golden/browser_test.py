#!/usr/bin/env python3
"""The HTML report in a real browser (CTest label `browser`).

Generates report.html pages (the writers' fixed synthetic fixtures, a passing and a failing real
`gradcert run`, a real `gradcert audit` of a broken migration), then, for each page in headless
Chromium: the page is self-contained (no URL of any kind to fetch), the DOM (--dump-dom) holds
the banner with the expected verdict, every section and every chart, the page logged nothing to
the console (no error, no blocked request: --enable-logging=stderr, grep for CONSOLE / Uncaught;
a canary page that throws proves the grep sees errors), and a screenshot is not blank (pixels
other than the background, counted with a standard-library PNG decoder). The fixture report is
also shot in dark mode (its background must be dark) and printed to PDF.

No browser: exits 77 (SKIP_RETURN_CODE), never a pass. GRADCERT_CHROMIUM=PATH picks the browser.
  golden/browser_test.py --gradcert build/gradcert --golden build/golden/gradcert_golden --out DIR
Screenshots, DOM dumps and logs stay in DIR.
"""
import argparse
import collections
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

SKIP = 77


def find_browser():
    """GRADCERT_CHROMIUM names the browser (only that one); else the first of the usual names."""
    chosen = os.environ.get("GRADCERT_CHROMIUM")
    names = [chosen] if chosen else ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
    for name in names:
        path = shutil.which(name)
        if path:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
                if out.returncode == 0:
                    return path, out.stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                pass
    return None, None


class Browser:
    def __init__(self, exe, workdir):
        self.exe, self.profile = exe, os.path.join(workdir, "chromium-profile")

    def run(self, url, *flags):
        cmd = [self.exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--user-data-dir=" + self.profile, "--enable-logging=stderr", "--v=0",
               "--hide-scrollbars", *flags, url]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return out.returncode, out.stdout, out.stderr


def console_lines(stderr):
    """What the page logged: Chromium writes console messages as ...:CONSOLE:N] or ...:CONSOLE(N)]."""
    return [l for l in stderr.splitlines() if ":CONSOLE" in l or "Uncaught" in l]


# ---- PNG (8-bit RGB / RGBA, as Chromium writes screenshots), standard library only

def png_pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(path + ": not a PNG")
    at, idat = 8, b""
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        at += 12 + n
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    if depth != 8 or color not in (2, 6) or interlace:
        raise ValueError(path + ": expected 8-bit RGB(A), non-interlaced")
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(idat)
    rows, prev = [], bytes(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for x in range(stride):
                line[x] = (line[x] + ((line[x - bpp] if x >= bpp else 0) + prev[x]) // 2) & 255
        elif f == 4:
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def pixel_stats(path):
    """(background colour, share of other pixels, distinct colours)."""
    width, height, bpp, rows = png_pixels(path)
    counts = collections.Counter()
    for row in rows:
        for x in range(0, len(row), bpp):
            counts[row[x:x + 3]] += 1
    background, n = counts.most_common(1)[0]
    return tuple(background), 1 - n / (width * height), len(counts)


# ---- the pages

REPORT_SECTIONS = ["verdict", "environment", "checks", "tensors", "mutants", "memory", "throughput", "spec-section"]
AUDIT_SECTIONS = ["verdict", "environment", "differences", "sides", "checks", "updates", "tensors", "memory", "notes",
                  "spec-section"]


def check_source(html):
    """Self-contained: nothing to fetch, from anywhere."""
    bad = []
    for m in re.finditer(r'\b(?:src|href|action|poster|data)\s*=\s*"([^"]*)"', html):
        if not (m.group(1).startswith("#") or m.group(1).startswith("data:")):
            bad.append("reference to " + m.group(1))
    for what in ("http://", "https://", "url(", "@import", "<iframe", "<object", "<embed"):
        if what in html:
            bad.append("contains " + what)
    if not re.match(r"(<!--[^\n]*-->\n)?<!DOCTYPE html>", html):
        bad.append("does not start with <!DOCTYPE html>")
    return bad


def check_dom(dom, page):
    bad = []
    m = re.search(r'<header id="verdict" class="banner (\w+)"', dom)
    if not m:
        bad.append("no verdict banner")
    elif m.group(1) != page["verdict"]:
        bad.append("verdict %s, expected %s" % (m.group(1), page["verdict"]))
    for sid in page["sections"]:
        if 'id="%s"' % sid not in dom:
            bad.append("missing section #" + sid)
    for chart in page["charts"]:
        if 'data-chart="%s"' % chart not in dom:
            bad.append("missing chart " + chart)
    for text in page.get("text", []):
        if text not in dom:
            bad.append("missing " + repr(text))
    if "</html>" not in dom:
        bad.append("DOM dump incomplete")
    return bad


def run(cmd, expect_rc, log):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
    if out.returncode != expect_rc:
        raise SystemExit("browser_test: %s exited %d, expected %d (log: %s)" % (cmd[1], out.returncode, expect_rc, log))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gradcert", required=True)
    ap.add_argument("--golden", required=True, help="gradcert_golden (writes the fixture pages)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    browser_exe, version = find_browser()
    if not browser_exe:
        print("browser_test: SKIP: no headless Chromium (install the Debian package chromium: scripts/bootstrap)")
        return SKIP
    print("browser_test: " + version)
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    browser = Browser(browser_exe, out)

    # The console check must see errors: a canary page that throws and is refused a request.
    canary = os.path.join(out, "canary.html")
    with open(canary, "w") as f:
        f.write('<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
                'script-src \'unsafe-inline\'"><p>canary</p><script>throw new Error("canary")</script>')
    _, _, err = browser.run("file://" + canary, "--dump-dom")
    if not any("Uncaught" in l and "canary" in l for l in console_lines(err)):
        print("browser_test: FAIL: the console check does not see a page's uncaught error:\n" + err)
        return 1

    # Pages: the writers' fixtures (every section populated), then real runs.
    fixtures = os.path.join(out, "fixtures")
    os.makedirs(fixtures)
    subprocess.run([args.golden, "--gtest_filter=Writers.reportHtml:Writers.auditHtml"], capture_output=True,
                   env=dict(os.environ, GRADCERT_HTML_OUT=fixtures), timeout=300)
    tight = os.path.join(out, "tight-spec.json")
    with open(tight, "w") as f:
        json.dump({"tolerance": {"float64": 3e-16, "floor_factor": 0}, "memory": {"budget_bytes": 100000}}, f)
    run([args.gradcert, "run", "--backend", "ddp", "--world", "2", "--out", os.path.join(out, "run-pass")], 0,
        os.path.join(out, "run-pass.log"))
    run([args.gradcert, "run", "--backend", "zero2", "--world", "2", "--spec", tight, "--out",
         os.path.join(out, "run-fail")], 1, os.path.join(out, "run-fail.log"))
    run([args.gradcert, "audit", "--before", "ddp", "--after", "ddp+inject=local-mean", "--world", "2", "--out",
         os.path.join(out, "audit")], 1, os.path.join(out, "audit.log"))

    run_charts = ["tolerance", "tensor-grad", "tensor-params", "memory", "throughput"]
    pages = [
        {"name": "fixture_report", "path": os.path.join(fixtures, "fixture_report.html"), "verdict": "interrupted",
         "sections": REPORT_SECTIONS, "charts": run_charts + ["mutant-matrix"], "dark": True, "pdf": True},
        {"name": "fixture_audit_differences", "path": os.path.join(fixtures, "fixture_audit_differences.html"),
         "verdict": "fail", "sections": AUDIT_SECTIONS,
         "charts": ["tolerance", "audit-diff-grad", "audit-diff-params", "side-before-grad", "side-after-grad"]},
        {"name": "fixture_audit_failed_run", "path": os.path.join(fixtures, "fixture_audit_failed_run.html"),
         "verdict": "interrupted", "sections": AUDIT_SECTIONS, "charts": ["tolerance", "side-before-grad"]},
        {"name": "fixture_audit_preserved", "path": os.path.join(fixtures, "fixture_audit_preserved.html"),
         "verdict": "pass", "sections": AUDIT_SECTIONS,
         "charts": ["tolerance", "audit-diff-grad", "side-before-grad", "side-after-grad"]},
        {"name": "run_pass", "path": os.path.join(out, "run-pass", "report.html"), "verdict": "pass",
         "sections": REPORT_SECTIONS, "charts": run_charts},
        {"name": "run_fail", "path": os.path.join(out, "run-fail", "report.html"), "verdict": "fail",
         "sections": REPORT_SECTIONS, "charts": run_charts, "text": ['class="ref budget"', "above the tolerance"]},
        {"name": "audit", "path": os.path.join(out, "audit", "report.html"), "verdict": "fail",
         "sections": AUDIT_SECTIONS, "charts": ["tolerance", "audit-diff-grad", "side-before-grad", "side-after-grad"]},
    ]
    failures = 0
    for page in pages:
        name, path = page["name"], page["path"]
        problems = []
        if not os.path.exists(path):
            print("browser_test: FAIL %s: %s was not written" % (name, path))
            failures += 1
            continue
        html = open(path, encoding="utf-8").read()
        problems += check_source(html)
        url = "file://" + path
        rc, dom, err = browser.run(url, "--virtual-time-budget=3000", "--dump-dom")
        with open(os.path.join(out, name + ".dom.html"), "w") as f:
            f.write(dom)
        with open(os.path.join(out, name + ".chromium.log"), "w") as f:
            f.write(err)
        if rc != 0:
            problems.append("--dump-dom exited %d" % rc)
        problems += check_dom(dom, page)
        problems += ["console: " + l for l in console_lines(err)]
        shot = os.path.join(out, name + ".png")
        rc, _, err = browser.run(url, "--window-size=1280,1600", "--screenshot=" + shot)
        problems += ["console: " + l for l in console_lines(err)]
        if rc != 0 or not os.path.exists(shot):
            problems.append("no screenshot")
        else:
            background, other, colours = pixel_stats(shot)
            print("browser_test: %-26s %8d bytes  screenshot: %.1f%% non-background pixels, %d colours" %
                  (name, len(html.encode("utf-8")), 100 * other, colours))
            if other < 0.02 or colours < 8:
                problems.append("screenshot looks blank (%.2f%% non-background, %d colours)" % (100 * other, colours))
            if sum(background) < 3 * 200:
                problems.append("light mode background is not light: %s" % (background,))
        if page.get("dark"):
            dark = os.path.join(out, name + ".dark.png")
            browser.run(url, "--force-dark-mode", "--window-size=1280,1600", "--screenshot=" + dark)
            background, other, _ = pixel_stats(dark)
            if sum(background) > 3 * 60 or other < 0.02:
                problems.append("dark mode: background %s, %.2f%% other pixels" % (background, 100 * other))
        if page.get("pdf"):
            pdf = os.path.join(out, name + ".pdf")
            browser.run(url, "--no-pdf-header-footer", "--print-to-pdf=" + pdf)
            pages_printed = len(re.findall(rb"/Type\s*/Page[^s]", open(pdf, "rb").read())) if os.path.exists(pdf) else 0
            print("browser_test: %-26s printed to PDF: %d pages" % (name, pages_printed))
            if pages_printed < 1:
                problems.append("printing to PDF produced no page")
        for p in problems:
            print("browser_test: FAIL %s: %s" % (name, p))
        failures += 1 if problems else 0
    print("browser_test: %s (%d pages; screenshots, DOM dumps and logs in %s)" %
          ("FAILED" if failures else "OK", len(pages), out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
