"""The GPU pins stay the CPU pins less torch, so a GPU host installs what the tests ran with."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(name: str) -> dict[str, str]:
    found = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            package, version = line.split("==")
            found[re.sub(r"[-_.]+", "-", package.lower())] = version
    return found


def test_gpu_pins_are_the_cpu_pins_without_torch():
    cpu, gpu = pins("constraints-cpu.txt"), pins("constraints-gpu.txt")
    assert "torch" in cpu and "torch" not in gpu
    assert {k: v for k, v in cpu.items() if k != "torch"}.items() <= gpu.items()


def test_the_gpu_extra_is_pinned_for_gpu_hosts():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = pins("constraints-gpu.txt")
    for requirement in extras["gpu"]:
        assert re.split(r"[<>=!~ ]", requirement, maxsplit=1)[0] in gpu
