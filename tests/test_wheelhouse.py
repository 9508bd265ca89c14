"""scripts/check_wheelhouse.py on small fake wheelhouses: what an offline GPU host would miss, it reports."""
import importlib.util
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_wheelhouse", ROOT / "scripts" / "check_wheelhouse.py")
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)

PY312 = "cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64"


def wheel(folder: Path, name: str, version: str, requires=(), tags="py3-none-any", python=None) -> Path:
    """A wheel with only its METADATA: all the checker reads."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-{tags}.whl"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Python: {python}"] if python else []
    lines += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA", "\n".join(lines) + "\n")
    return path


@pytest.fixture
def house(tmp_path):
    """Our package over a small tree: a torch requirement, markers, an extra, a compiled wheel."""
    wheel(tmp_path, "jevany-daemon", "0.1.0", [
        "torch>=2.8", "transformers>=5.24", "uvloop>=0.17; sys_platform != 'win32'",
        "pywin32; sys_platform == 'win32'",                   # another platform's: not needed
        "tomli; python_version < '3.11'",                     # another Python's: not needed
        'flash-linear-attention>=0.4; extra == "gpu"'])
    wheel(tmp_path, "transformers", "5.24.0", ["tokenizers<0.24,>=0.23.1", 'torch>=2.6; extra == "torch"'])
    wheel(tmp_path, "tokenizers", "0.23.3", tags="cp310-abi3-manylinux_2_17_x86_64")    # abi3: runs on 3.12
    wheel(tmp_path, "uvloop", "0.23.0", tags=PY312)
    wheel(tmp_path, "flash-linear-attention", "0.5.2", ["einops"])
    wheel(tmp_path, "einops", "0.8.2")
    return tmp_path


def problems(folder, provided="2.11.0", roots=("jevany-daemon[gpu]",), python="3.12"):
    return checker.check(folder, python, {"torch": checker.Version(provided)} if provided else {}, list(roots))[1]


def test_a_complete_wheelhouse_has_no_problem(house, capsys):
    assert problems(house) == []
    assert checker.main([str(house), "--provided", "torch==2.11.0", "--root", "jevany-daemon[gpu]"]) == 0
    assert "6 wheels" in capsys.readouterr().err


def test_a_missing_requirement_is_named_with_who_needs_it(house):
    next(house.glob("einops-*")).unlink()
    assert problems(house) == ["flash-linear-attention 0.5.2 requires einops: not in the wheelhouse"]
    assert checker.main([str(house), "--provided", "torch==2.11.0", "--root", "jevany-daemon[gpu]"]) == 1


def test_an_extra_is_followed_only_where_asked(house):
    next(house.glob("flash_linear_attention-*")).unlink()
    assert problems(house, roots=["jevany-daemon"]) == []      # transformers[torch] is not asked for either
    assert problems(house) == ["jevany-daemon 0.1.0 requires flash-linear-attention>=0.4; extra == \"gpu\": "
                               "not in the wheelhouse"]


def test_a_version_outside_the_range_is_reported(house):
    next(house.glob("tokenizers-*")).unlink()
    wheel(house, "tokenizers", "0.22.2", tags="cp39-abi3-manylinux_2_17_x86_64")
    assert problems(house) == ["transformers 5.24.0 requires tokenizers<0.24,>=0.23.1: tokenizers 0.22.2 in the wheelhouse"]


def test_torch_comes_from_the_host_and_its_version_is_checked(house):
    assert problems(house, provided=None) == ["jevany-daemon 0.1.0 requires torch>=2.8: not in the wheelhouse"]
    assert problems(house, provided="2.7.1") == ["jevany-daemon 0.1.0 requires torch>=2.8: torch 2.7.1 provided by the host"]


def test_wheels_for_another_python_or_platform_are_refused(house):
    wheel(house, "pyzmq", "27.3.0", tags="cp311-cp311-manylinux_2_28_x86_64")
    wheel(house, "av", "18.1.0", tags="cp312-cp312-manylinux_2_34_x86_64")          # newer glibc than 2.28
    wheel(house, "msgpack", "1.2.4", tags="cp312-cp312-win_amd64")
    wheel(house, "rich", "15.0.0", python=">=3.13")
    found = problems(house)
    assert len(found) == 4 and all(any(w in p for p in found) for w in ("pyzmq", "av-", "msgpack", "rich"))
    on_311 = problems(house, python="3.11")
    assert any(p.startswith("uvloop-") for p in on_311) and not any(p.startswith("pyzmq-") for p in on_311)


def test_two_versions_of_one_package_are_reported(house):
    wheel(house, "einops", "0.8.1")
    assert problems(house) == ["einops: two versions, 0.8.1 and 0.8.2"]
