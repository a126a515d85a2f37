"""One torch for the ``real`` extra, the README, the getting-started page and CI: the extra
pins the very version the README installs from PyTorch's CPU index first, so pip keeps that
CPU build rather than fetch another torch (PyPI's Linux build is the CUDA one, several GB)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def extra(name: str) -> list[str]:
    """The requirements of one extra in setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return [r.strip() for r in cfg["options.extras_require"][name].splitlines() if r.strip()]


def test_the_real_extra_pins_one_exact_torch() -> None:
    torches = [r for r in extra("real") if re.match(r"torch\b", r)]
    assert len(torches) == 1 and re.fullmatch(r"torch==\d+\.\d+\.\d+", torches[0]), torches


def test_the_pages_install_that_torch_from_the_cpu_index_before_the_extra() -> None:
    pin = next(r for r in extra("real") if r.startswith("torch=="))
    for page in ("README.md", "docs/getting-started.md"):
        text = (ROOT / page).read_text()
        command = f"pip install {pin} --index-url {CPU_INDEX}\npip install -e '.[real]'"
        assert command in text, f"{page} does not say: {command}"
        assert set(re.findall(r"torch==[\d.]+", text)) == {pin}, page


def test_ci_installs_the_same_torch() -> None:
    pin = next(r for r in extra("real") if r.startswith("torch=="))
    assert set(re.findall(r"torch==[\d.]+", (ROOT / ".ci/run").read_text())) == {pin}
