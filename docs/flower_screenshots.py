"""Regenerate docs/img/flower-tasks.png, flower-task.png and flower-worker.png.

They come from the Flower browser test (a private Redis, two emulated-GPU workers,
Flower and headless Chromium), so the pictures show what the test checks. Needs
``redis-server`` and ``chromium`` on PATH. Run from the repository root::

    python docs/flower_screenshots.py [OUTPUT_DIR]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    out = Path(argv[0]).resolve() if argv else ROOT / "docs" / "img"
    env = {**os.environ, "COMPASS_FLOWER_SCREENSHOTS": str(out)}
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "tests/app/test_flower_browser.py"], cwd=ROOT, env=env)
    shots = [out / "flower-tasks.png", out / "flower-task.png", out / "flower-worker.png"]
    if rc == 0 and all(p.is_file() for p in shots):
        print("\n".join(str(p) for p in shots))
        return 0
    print("no screenshots written (see the test output above)", file=sys.stderr)
    return rc or 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
