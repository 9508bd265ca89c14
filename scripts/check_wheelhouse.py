"""Is a wheelhouse complete for one target? Every requirement of every wheel met inside the folder.

An offline host installs with `pip install --no-index --find-links DIR`, so a
requirement the folder does not meet fails there, far from the machine that
built it. This reads each wheel's METADATA (Requires-Dist, Requires-Python)
and its file name's tags, evaluates the markers for the target (a Python
version on Linux x86_64 by default), and reports:

- a requirement no wheel in the folder meets (absent, or the wrong version);
- a wheel that cannot install on the target (its tags or Requires-Python);
- one package in two versions.

Packages the host already has (torch: the GPU host's CUDA build) are named
with --provided NAME==VERSION; a requirement on them is checked against that
version. Extras are followed where a requirement asks for them, and for the
roots named with --root (our packages with the extras the host installs).

    python scripts/check_wheelhouse.py wheelhouse --python-version 3.12 \
        --provided torch==2.11.0 --root 'jevany-daemon[gpu,multimodal]'

Exit 0 when complete, 1 with one line per problem. Offline, stdlib plus
`packaging` (pip's own copy where it is not installed).
"""
import argparse
import re
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.tags import parse_tag
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
except ImportError:     # a bare python3 with pip: pip vendors packaging
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.tags import parse_tag
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version


@dataclass
class Wheel:
    path: Path
    name: str
    version: Version
    tags: frozenset
    requires: list[Requirement] = field(default_factory=list)
    requires_python: str | None = None


def read_wheel(path: Path) -> Wheel:
    name, version, _build, tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        headers = HeaderParser().parsestr(zf.read(meta).decode("utf-8"))
    return Wheel(path, canonicalize_name(name), version, frozenset(tags),
                 [Requirement(r) for r in headers.get_all("Requires-Dist") or []],
                 headers.get("Requires-Python"))


def environment(python_version: str, machine: str = "x86_64") -> dict:
    """Marker values for CPython python_version on Linux `machine` (not this interpreter's)."""
    env = default_environment()
    full = python_version if python_version.count(".") == 2 else python_version + ".0"
    env.update(python_version=".".join(full.split(".")[:2]), python_full_version=full,
               implementation_name="cpython", platform_python_implementation="CPython",
               implementation_version=full, sys_platform="linux", platform_system="Linux",
               os_name="posix", platform_machine=machine)
    return env


def supported(tag, python_version: str, platforms: set[str]) -> bool:
    """Whether one wheel tag installs on CPython python_version on one of `platforms`."""
    major, minor = (int(x) for x in python_version.split(".")[:2])
    if tag.platform != "any" and tag.platform not in platforms:
        return False
    kind, digits = tag.interpreter[:2], tag.interpreter[2:]
    if kind not in ("cp", "py") or not digits.isdigit() or digits[0] != str(major):
        return False
    if len(digits) == 1:                      # py3: any 3.x
        return kind == "py"
    wanted = int(digits[1:])
    # cp312-cp312 needs exactly 3.12; an abi3 wheel (cp39-abi3) or a py39 one runs on 3.9 and later
    return wanted <= minor if (tag.abi == "abi3" or kind == "py") else wanted == minor


def linux_platforms(machine: str = "x86_64", glibc: tuple[int, int] = (2, 28)) -> set[str]:
    """Every manylinux tag a glibc `glibc` host of `machine` accepts (PEP 600, with the legacy aliases)."""
    tags = {f"manylinux_2_{minor}_{machine}" for minor in range(5, glibc[1] + 1)}
    legacy = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
    tags |= {f"{alias}_{machine}" for alias, minor in legacy.items() if minor <= glibc[1]}
    return tags


def check(folder: Path, python_version: str, provided: dict[str, Version], roots: list[str],
          machine: str = "x86_64", glibc: tuple[int, int] = (2, 28)) -> tuple[list[Wheel], list[str]]:
    """(wheels, problems) of the folder for the target."""
    wheels = [read_wheel(p) for p in sorted(folder.glob("*.whl"))]
    problems, by_name = [], {}
    for w in wheels:
        if w.name in by_name and by_name[w.name].version != w.version:
            problems.append(f"{w.name}: two versions, {by_name[w.name].version} and {w.version}")
        by_name.setdefault(w.name, w)
    env, platforms = environment(python_version, machine), linux_platforms(machine, glibc)
    for w in wheels:
        if not any(supported(t, python_version, platforms) for t in w.tags):
            problems.append(f"{w.path.name}: no tag installs on CPython {python_version} manylinux {machine}")
        if w.requires_python and Version(env["python_full_version"]) not in SpecifierSet(w.requires_python):
            problems.append(f"{w.path.name}: Requires-Python {w.requires_python} excludes {python_version}")

    # Every wheel's own requirements, then the extras that roots and requirements ask for.
    todo = [(w.name, frozenset()) for w in wheels] + [(canonicalize_name(r.name), frozenset(r.extras))
                                                      for r in map(Requirement, roots)]
    for r in map(Requirement, roots):
        problems += _unmet(r, "(root)", by_name, provided)
    seen = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in by_name:
            continue
        seen.add((name, extras))
        wheel = by_name[name]
        for req in wheel.requires:
            if not _applies(req, env, extras):
                continue
            problems += _unmet(req, f"{wheel.name} {wheel.version}", by_name, provided)
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return wheels, sorted(set(problems))


def _applies(req: Requirement, env: dict, extras: frozenset) -> bool:
    if req.marker is None:
        return True
    # A requirement of no extra applies whatever extras were asked for; one of an extra only when asked.
    return any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras))


def _unmet(req: Requirement, who: str, by_name: dict, provided: dict[str, Version]) -> list[str]:
    name = canonicalize_name(req.name)
    have = provided.get(name) or (by_name[name].version if name in by_name else None)
    if have is None:
        return [f"{who} requires {req}: not in the wheelhouse"]
    if not req.specifier.contains(have, prereleases=True):
        source = "provided by the host" if name in provided else "in the wheelhouse"
        return [f"{who} requires {req}: {name} {have} {source}"]
    return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python-version", default="3.12", help="target CPython, e.g. 3.12 [default: 3.12]")
    parser.add_argument("--machine", default="x86_64", help="target architecture [default: x86_64]")
    parser.add_argument("--glibc", default="2.28", help="target glibc: the newest manylinux tag it takes [2.28]")
    parser.add_argument("--provided", action="append", default=[], metavar="NAME==VERSION",
                        help="a package the host already has (repeatable), e.g. torch==2.11.0")
    parser.add_argument("--root", action="append", default=[], metavar="REQUIREMENT",
                        help="what the host will install, with its extras, e.g. 'jevany-daemon[gpu]'")
    args = parser.parse_args(argv)
    provided = {}
    for item in args.provided:
        name, _, version = item.partition("==")
        provided[canonicalize_name(name)] = Version(version)
    major, minor = (int(x) for x in args.glibc.split("."))
    wheels, problems = check(args.folder, args.python_version, provided, args.root, args.machine, (major, minor))
    if not wheels:
        print(f"{args.folder}: no wheels", file=sys.stderr)
        return 1
    for line in problems:
        print(line)
    size = sum(w.path.stat().st_size for w in wheels)
    verdict = f"{len(problems)} problem(s)" if problems else "every requirement met"
    print(f"{args.folder}: {len(wheels)} wheels, {size / 2**20:.1f} MiB, CPython {args.python_version} "
          f"manylinux_{args.glibc.replace('.', '_')}_{args.machine}: {verdict}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
