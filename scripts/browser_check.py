"""Open a report in a real browser and list what a reader would see wrong with it.

    python scripts/browser_check.py results/report/index.html --screenshot results/report/screenshot.png

Playwright for Python drives Debian's chromium (`apt-get install -y chromium`; no browser download): console errors,
uncaught exceptions and failed loads, images that did not load, report sections that are missing, and anything that
makes the page wider than the window (a wide table must scroll inside its own box). Exit 0 when the page is clean,
1 when it is not (problems printed), 2 when it cannot be checked.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import ViewportSize, sync_playwright

TEMPLATE = Path(__file__).resolve().parent.parent / "harness" / "report" / "templates" / "report.html.j2"
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
# Images with no pixels (naturalWidth 0) or never finished.
BROKEN_IMAGES_JS = ("Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                    ".map(i => i.alt || i.src.slice(0, 80))")
# The outermost elements that reach past the window's right edge: an element inside one of them, or inside a box that
# scrolls or clips, is not what widens the page.
TOO_WIDE_JS = """() => {
  const limit = document.documentElement.clientWidth;
  const clips = e => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(e).overflowX);
  const out = [];
  for (const e of document.body.querySelectorAll('*')) {
    if (e.getBoundingClientRect().right <= limit + 1) continue;
    let p = e.parentElement, inside = false;
    for (; p && p !== document.body; p = p.parentElement) {
      if (clips(p) || p.getBoundingClientRect().right > limit + 1) { inside = true; break; }
    }
    if (!inside) out.push(`<${e.tagName.toLowerCase()}> ${Math.round(e.getBoundingClientRect().right)} px `
                          + JSON.stringify((e.textContent || '').trim().slice(0, 60)));
  }
  return {page: document.documentElement.scrollWidth, window: limit, elements: out};
}"""


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def report_sections(template: Path = TEMPLATE) -> list[str]:
    """The section headings every report has: the <h2>s of the page template."""
    return re.findall(r"<h2>([^<{]+)</h2>", template.read_text())


def check_page(html_path: Path, screenshot: Path | None = None, sections: list[str] | None = None,
               images: bool = True) -> list[str]:
    """Load the page at 1280 px; return its problems. `sections`: headings that must be on it (report_sections()
    by default; [] for none). `images`: whether a page without images is a problem (the history page draws inline
    SVG, no images)."""
    binary = chromium_path()
    if binary is None:
        raise FileNotFoundError("chromium not found (Debian: apt-get install -y chromium)")
    sections = report_sections() if sections is None else sections
    problems: list[str] = []
    with sync_playwright() as pw:
        # --no-sandbox: CI and this VM run as root, where chromium's sandbox refuses to start.
        browser = pw.chromium.launch(executable_path=binary, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("console", lambda m: problems.append(f"console error: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"exception: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"load failed: {r.url[:80]} ({r.failure})"))
            page.goto(html_path.resolve().as_uri(), wait_until="load")
            problems += [f"image did not load: {b}" for b in page.evaluate(BROKEN_IMAGES_JS)]
            if images and page.evaluate("document.images.length") == 0:
                problems.append("the page has no images")
            headings = [h.strip() for h in page.locator("h2").all_inner_texts()]
            problems += [f"section missing: {s}" for s in sections if s not in headings]
            wide = page.evaluate(TOO_WIDE_JS)
            if wide["page"] > wide["window"]:
                problems.append(f"the page is {wide['page']} px wide in a {wide['window']} px window: "
                                + "; ".join(wide["elements"][:5]))
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("--screenshot", type=Path)
    args = ap.parse_args(argv)
    if not args.html.is_file():
        print(f"{args.html}: no such report", file=sys.stderr)
        return 2
    try:
        problems = check_page(args.html, args.screenshot)
    except (FileNotFoundError, PlaywrightError) as e:
        print(f"browser check: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    shot = f"; screenshot {args.screenshot}" if args.screenshot else ""
    print(f"{args.html}: {'clean' if not problems else f'{len(problems)} problem(s)'}{shot}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
