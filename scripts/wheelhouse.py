"""Build an offline wheelhouse for a GPU host: `make wheelhouse` runs this on a connected machine.

Every pin of constraints-gpu.txt as a wheel for the target (CPython version,
manylinux platform), downloaded with --no-deps so that nothing outside the
list comes along: not torch, which peft and accelerate require and the GPU
host already has as its CUDA build, nor torch's CUDA libraries. Then our two
packages as wheels, then check_wheelhouse.py: every requirement of every
wheel must be met inside the folder, or by the host's torch. The host then
installs with `pip install --no-index --find-links wheelhouse jevany-daemon`.

Wheels already in the folder are kept (pip does not download them again);
wheels of versions no longer pinned are removed, so the folder holds one
version of each package.
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_wheelhouse import Version, canonicalize_name, check, linux_platforms, parse_wheel_filename  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "constraints-gpu.txt"
# What a GPU host installs: the daemon with every extra the GPU pins cover, and the client's plot extra.
ROOTS = ["jevany-daemon[gpu,multimodal,test,bench]", "jevany-client[plot]"]
OURS = {"jevany-daemon": ROOT, "jevany-client": ROOT / "client"}
HOST_ONLY = re.compile(r"^(torch|triton|nvidia-.*)$")     # the host's CUDA stack: never in the folder


def pins(path: Path = PINS) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = version
    return found


def target(platform: str) -> tuple[str, tuple[int, int]]:
    """(machine, glibc) of a manylinux platform tag: manylinux_2_28_x86_64, or manylinux2014_x86_64."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if m:
        return m[3], (int(m[1]), int(m[2]))
    m = re.fullmatch(r"manylinux2014_(\w+)", platform)
    if m:
        return m[1], (2, 17)
    raise SystemExit(f"wheelhouse: unsupported platform {platform!r}: use manylinux_2_N_ARCH")


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64")
    parser.add_argument("--provided", action="append", default=[], metavar="NAME==VERSION",
                        help="what the host has already (torch==2.11.0); checked against our requirements")
    args = parser.parse_args(argv)
    machine, glibc = target(args.platform)
    pinned = pins()
    excluded = sorted(name for name in pinned if HOST_ONLY.match(name))
    if excluded:
        raise SystemExit(f"wheelhouse: {PINS.name} pins {', '.join(excluded)}: the GPU host's own, not ours to ship")
    args.out.mkdir(parents=True, exist_ok=True)

    # pip matches --platform exactly; a manylinux_2_28 host also takes every older manylinux wheel.
    platforms = [f for p in sorted(linux_platforms(machine, glibc)) for f in ("--platform", p)]
    pip("download", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", args.python_version, *platforms, "--dest", str(args.out), "--requirement", str(PINS))
    for path in args.out.glob("*.whl"):
        name, version, *_ = parse_wheel_filename(path.name)
        name = canonicalize_name(name)
        if name in OURS or name not in pinned or version != Version(pinned[name]):    # ours: built anew below
            print(f"removing {path.name}")
            path.unlink()
    pip("wheel", "--no-deps", "--wheel-dir", str(args.out), *(str(p) for p in OURS.values()))

    provided = {}
    for item in args.provided:
        name, _, version = item.partition("==")
        provided[canonicalize_name(name)] = Version(version)
    wheels, problems = check(args.out, args.python_version, provided, ROOTS, machine, glibc)
    for line in problems:
        print(line)
    size = sum(w.path.stat().st_size for w in wheels)
    print(f"{args.out}: {len(wheels)} wheels, {size / 2**20:.0f} MiB for CPython {args.python_version} "
          f"{args.platform}: {'%d problem(s)' % len(problems) if problems else 'every requirement met'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
