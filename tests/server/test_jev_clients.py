"""The field's own tools against a real daemon: jevcompat's conformance suite, the official typesafe-sdk
(sync and async, zstd bodies), and two clients from the package index (jev-lite, jev-fn).

The daemon serves the starter model (the one users get), with --http on loopback, in each dialect.
"""
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .daemons import Daemon, wait_for
from .http_proc import free_port, healthy

TOKEN = "jevcompat-test-token"
# The SHOULDs where JevAny's choices differ from TypeSafe's (docs/JEV-API.md), kept by default.
JEVANY_CHOICES = {"response.extensions", "confidence.formula", "errors.validation-shape"}
STATE = {"ticket": "My parcel was due two weeks ago and support has not answered. " * 20, "tier": "gold"}


@pytest.fixture(scope="module")
def daemons(trained_model):
    """daemons(dialect, token) -> the port of a ready daemon serving the starter model, started once."""
    started: dict = {}

    def get(dialect: str, token: bool) -> int:
        if (dialect, token) not in started:
            directory = Path(tempfile.mkdtemp(prefix="jvd-"))
            port = free_port()
            args = ["--http", f"127.0.0.1:{port}", "--max-batch-size", "32", "--http-dialect", dialect]
            if token:
                (directory / "token").write_text(TOKEN)
                (directory / "token").chmod(0o600)
                args += ["--http-token-file", str(directory / "token")]
            daemon = Daemon(directory, trained_model, *args)
            started[dialect, token] = (daemon, port)
            daemon.wait_ready()
            wait_for(lambda: healthy(port), 60, "the gateway answering /health")
        return started[dialect, token][1]

    yield get
    for daemon, _ in started.values():
        daemon.stop()
        shutil.rmtree(daemon.dir, ignore_errors=True)


def jevcompat(port: int, out: Path, key: str | None) -> dict:
    """`jevcompat test URL [--key KEY] --json OUT`, its report."""
    args = ["test", f"http://127.0.0.1:{port}", "--json", str(out), "--timeout", "60"]
    if key:
        args += ["--key", key]
    run = subprocess.run([sys.executable, "-c", "import sys; from jevcompat.cli import main; sys.exit(main())",
                          *args], capture_output=True, text=True, timeout=300)
    assert out.exists(), f"jevcompat wrote no report (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"
    return json.loads(out.read_text())


def by_status(report: dict, level: str) -> dict[str, set]:
    found: dict[str, set] = {}
    for result in report["results"]:
        if result["level"] == level:
            found.setdefault(result["status"], set()).add(result["id"])
    return found


def test_jevcompat_rates_the_daemon_conformant_with_and_without_a_token(daemons, tmp_path):
    open_default = jevcompat(daemons("jevany", False), tmp_path / "open.json", None)
    guarded_default = jevcompat(daemons("jevany", True), tmp_path / "guarded.json", TOKEN)
    strict = jevcompat(daemons("typesafe", True), tmp_path / "strict.json", TOKEN)
    musts_passed = set()
    for report, not_applicable in ((open_default, "auth.bearer"), (guarded_default, "auth.ignored-when-off"),
                                   (strict, "auth.ignored-when-off")):
        assert report["summary"]["verdict"] == "conformant" and not report["aborted"], report["summary"]
        musts = by_status(report, "MUST")
        # Each run can test only one of the two auth MUSTs: the one for the way the server is set up.
        assert musts.keys() == {"pass", "skip"} and musts["skip"] == {not_applicable}, musts
        musts_passed |= musts["pass"]
    assert len(musts_passed) == 33                   # every MUST of the spec passed, in one run or another
    for report in (open_default, guarded_default):
        assert by_status(report, "SHOULD").get("fail") == JEVANY_CHOICES
    assert by_status(guarded_default, "SHOULD")["pass"] >= {"auth.missing", "auth.invalid"}
    shoulds = by_status(strict, "SHOULD")
    assert shoulds.keys() == {"pass"} and len(shoulds["pass"]) == 15, shoulds


def test_the_official_sdk_with_its_defaults_sync_and_async(daemons):
    from typesafe_sdk import AsyncTypeSafeClient, Choice, Noul, Score, TypeSafeClient
    from typesafe_sdk._core.compression import resolve_compression

    assert resolve_compression(None) == "zstd", "the SDK's [zstd] extra is installed, so it compresses"
    base = f"http://127.0.0.1:{daemons('jevany', True)}"
    questions = {
        "refund": Noul(instructions="Should we refund the order?", criteria={"true": "the parcel is lost"}),
        "team": Choice(instructions="Which team handles it?", criteria={"Billing": None, "Shipping": "parcels"}),
        "anger": Score(instructions="How frustrated is the customer?", criteria=["Calm", "Annoyed", "Furious"]),
    }
    assert len(json.dumps({"state": STATE}).encode()) > 1024       # over the SDK's threshold: sent as zstd
    with TypeSafeClient(api_key=TOKEN, base_url=base) as client:   # model: the SDK's default, jev-latest
        first = client.system_one(state=STATE, questions=questions)
        [served] = [m.name for m in client.models.list().models]

    async def concurrently():
        async with AsyncTypeSafeClient(api_key=TOKEN, base_url=base) as client:
            return await asyncio.gather(*(client.system_one(state=STATE, questions=questions) for _ in range(8)))

    for answer in [first, *asyncio.run(concurrently())]:
        assert answer.model == served and 0 <= answer.nouls["refund"].noul <= 1
        assert answer.choices["team"].choice in ("Billing", "Shipping")
        assert answer.scores["anger"].legend == {0: "Calm", 1: "Annoyed", 2: "Furious"}    # the SDK keys it by int
        assert abs(answer.nouls["refund"].noul - first.nouls["refund"].noul) < 1e-6
    with TypeSafeClient(api_key="wrong", base_url=base) as client:
        from typesafe_sdk import TypeSafeAuthenticationError

        with pytest.raises(TypeSafeAuthenticationError) as refused:
            client.system_one(state=STATE, questions=questions)
        assert refused.value.request_id.startswith("req_")


def test_jev_lite_sync_and_async(daemons, trained_model):
    from jev_lite import AsyncTypeSafe, Choice, Noul, Score, TypeSafe

    base = f"http://127.0.0.1:{daemons('jevany', True)}"
    questions = {"warn": Noul(instructions="Warn someone?", true="a person must act"),
                 "area": Choice(instructions="Which area?", criteria={"security": "doors", "climate": None}),
                 "urgency": Score(instructions="How urgent?", criteria=["Ignore", "Today", "Right now"])}
    with TypeSafe(api_key=TOKEN, base_url=base) as client:
        sync = client.system_one.create(state="the back door is open at night", questions=questions)

    async def ask():
        async with AsyncTypeSafe(api_key=TOKEN, base_url=base) as client:
            return await client.system_one.create(state="the back door is open at night", questions=questions)

    later = asyncio.run(ask())
    for r in (sync, later):
        assert r.model == trained_model.name and r.usage.input_tokens > 0
        assert r.choices["area"].choice in ("security", "climate") and 0 <= r.scores["urgency"].score <= 2
    assert abs(sync.nouls["warn"].noul - later.nouls["warn"].noul) < 1e-6


def test_jev_fn_through_the_sdk(daemons):
    import jev_fn

    jev_fn.configure(api_key=TOKEN, base_url=f"http://127.0.0.1:{daemons('typesafe', True)}")
    try:
        p = jev_fn.jev("Is the customer asking for a refund?", context="I want my money back for the late parcel")
        q = asyncio.run(jev_fn.ajev("Is the customer asking for a refund?",
                                    context="I want my money back for the late parcel"))
    finally:
        jev_fn.configure(api_key=None, base_url=None)
    assert 0 <= p <= 1 and abs(p - q) < 1e-6
