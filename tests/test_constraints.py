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


def _bounds() -> dict[str, list]:
    """Every requirement the two pyproject files state (dependencies and extras), by package."""
    from packaging.requirements import Requirement     # transformers requires packaging: always here

    found: dict[str, list] = {}
    for path in ("pyproject.toml", "client/pyproject.toml"):
        project = tomllib.loads((ROOT / path).read_text())["project"]
        for text in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
            requirement = Requirement(text)
            found.setdefault(re.sub(r"[-_.]+", "-", requirement.name.lower()), []).append(requirement)
    return found


def test_every_pin_satisfies_the_pyproject_bounds():
    bounds = _bounds()
    assert {"torch", "transformers", "peft", "pyzmq"} <= bounds.keys()
    checked = 0
    for name in ("constraints-cpu.txt", "constraints-gpu.txt"):
        for package, version in pins(name).items():
            for requirement in bounds.get(package, []):
                assert requirement.specifier.contains(version, prereleases=True), \
                    f"{name} pins {package}=={version}, below {requirement}"
                checked += 1
    assert checked >= 40      # both files, every bounded package of ours (not only the few named above)


def test_the_bound_check_catches_a_pin_below_a_bound():
    # The check above, on a pin it must refuse: the transformers that lacked the cache= API.
    (transformers,) = _bounds()["transformers"]
    assert not transformers.specifier.contains("5.23.0") and transformers.specifier.contains("5.24.0")
