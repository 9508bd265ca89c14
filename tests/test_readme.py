"""The examples of the README and of every page under docs/, run as written, so they cannot rot.

Every ```sh and ```python block of the README and then of the docs pages runs,
in page order (the README, then the pages in the order its map, "The docs",
lists them) and in order within a page, from one scratch directory (the pages'
relative paths, like runs/tiny, land there), against a real daemon on the
default endpoint. A block that cannot run here (it needs root, a GPU, an hour)
says so in an HTML comment just above it:
`<!-- example: not run by the README test: WHY -->`, and nothing else is
skipped. A `jevany-daemon serve` line is started, must become ready on the
default endpoint, and must exit 0 on SIGTERM. docs/REQUESTS.md's JSON bodies
are decided too, and its worked example is checked against the code.

The pages point at each other's sections, so every relative link of the
README, the docs pages and tests/README.md must lead to a file that is there
and, where it names one, a heading that is there.
"""
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from jevany_client import JevClient, JevTimeoutError
from jevany_client.answers import shape_answer
from jevany_client.schema import parse_decision
from tests.docs import DOCS, README, ROOT, headings, is_relative, links, pages, slug
from tests.server.daemons import READY_WITHIN_S, STOP_WITHIN_S, wait_for

REQUESTS = DOCS / "REQUESTS.md"
TESTS_README = ROOT / "tests" / "README.md"
NOT_RUN = re.compile(r"<!-- example: not run by the README test: (?P<why>.+?) -->")
COMMAND_S = 180


@dataclass
class Block:
    where: str         # the file and the fence's line in it, for failure messages
    lang: str
    text: str
    not_run: str | None


def blocks(path: Path, langs: tuple[str, ...]) -> list[Block]:
    found, lines = [], path.read_text().split("\n")
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w+)", lines[i])
        if fence is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        if fence[1] in langs:
            above = next((x for x in reversed(lines[:i]) if x.strip()), "")
            marker = NOT_RUN.fullmatch(above.strip())
            found.append(Block(f"{path.relative_to(ROOT)}:{i + 1}", fence[1], "\n".join(lines[i + 1:end]),
                               marker["why"] if marker else None))
        i = end + 1
    return found


def commands(script: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comment lines dropped."""
    out, pending = [], ""
    for line in script.split("\n"):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    assert not pending, f"a continuation line ends the block: {pending!r}"
    return out


def is_server(command: str) -> bool:
    return re.search(r"\bjevany-daemon serve\b", command) is not None and "--help" not in command


class Sandbox:
    """One scratch directory and environment for every example, and the daemon they talk to."""

    def __init__(self, directory: Path, cache: Path):
        self.dir = directory
        (directory / ".venv").symlink_to(sys.prefix)
        runtime = directory / "runtime"
        runtime.mkdir(mode=0o700)
        self.endpoint = f"ipc://{runtime}/jevany/daemon.sock"
        drop = {"JEVANY_ENDPOINT", "JEVANY_CONTROL_ENDPOINT", "JEVANY_MODEL", "JEVANY_BIND",
                "JEVANY_CONTROL", "VIRTUAL_ENV"}
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(XDG_RUNTIME_DIR=str(runtime), JEVANY_CACHE_DIR=str(cache),
                        HF_HUB_OFFLINE="1", PATH=f"{sys.prefix}/bin:{os.environ['PATH']}")
        self.daemon: subprocess.Popen | None = None
        self.log = directory / "daemon.log"

    def _state(self) -> str | None:
        try:
            with JevClient(self.endpoint, timeout=2, retries=0) as client:
                return client.status()["state"]
        except JevTimeoutError:
            return None

    def serve(self, command: str, where: str) -> subprocess.Popen:
        """Start a serve command and wait until the default endpoint says ready."""
        with open(self.log, "ab") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.dir, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT)

        def ready():
            assert proc.poll() is None, f"{where}: `{command}` exited {proc.returncode}:\n{self.log.read_text()}"
            return self._state() == "ready"

        wait_for(ready, READY_WITHIN_S, f"{where}: `{command}` ready on {self.endpoint}", poll_s=0.2)
        return proc

    def stop(self, proc: subprocess.Popen, where: str) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        assert code == 0, f"{where}: exited {code} on SIGTERM:\n{self.log.read_text()}"

    def ensure_daemon(self) -> None:
        """The front door's serve line, kept serving; a fresh one after a block drained it."""
        if self.daemon is not None and self.daemon.poll() is None and self._state() == "ready":
            return
        self.stop_daemon()
        self.daemon = self.serve("jevany-daemon serve", "the examples' daemon")

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.stop(self.daemon, "the examples' daemon")
        self.daemon = None

    def run(self, argv: list[str], where: str) -> None:
        done = subprocess.run(argv, cwd=self.dir, env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_S)
        assert done.returncode == 0, (
            f"{where}: exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    if sys.prefix == sys.base_prefix:
        pytest.skip("the README's commands live in the project's .venv; run the tests from it (make test)")
    box = Sandbox(tmp_path_factory.mktemp("readme"), tmp_path_factory.mktemp("readme-cache"))
    yield box
    box.stop_daemon()


def examples() -> list[Block]:
    """Every sh and python block, in the order they run: the README, then the pages of its map."""
    return [block for page in pages() for block in blocks(page, ("sh", "python"))]


def test_every_docs_page_is_in_the_readmes_map_so_its_examples_run():
    assert sorted(pages()[1:]) == sorted(DOCS.glob("*.md")), "a page under docs/ missing from the README's map"


def test_every_example_runs_or_says_why_not():
    found = examples()
    assert len(found) >= 35, "the examples of the README and docs/ were not found"
    for block in found:
        assert block.not_run is None or len(block.not_run) > 10, f"{block.where}: say why"
    # The examples a new user tries first are never exempt: the README's first request, and the pages'.
    front = "\n".join(b.text for b in blocks(README, ("sh", "python")) if b.not_run is None)
    for must in ("jevany-daemon serve", "JevClient()", "jevany-client decide", "jevany-ctl status"):
        assert must in front, f"no README example that runs uses {must}"
    run = "\n".join(b.text for b in found if b.not_run is None)
    for must in ("jevany-daemon serve", "JevClient()", "decide_many", "JevModel.load",
                 "jevany-ctl status", "jevany-client decide", "jevany-ctl drain", "AsyncJevClient",
                 "jevany-eval"):
        assert must in run, f"no example that runs uses {must}"


def test_readme_examples_run_as_written(sandbox):
    ran = 0
    for block in examples():
        if block.not_run is not None:
            continue
        where = block.where
        if block.lang == "python":
            sandbox.ensure_daemon()
            sandbox.run([sys.executable, "-c", block.text], where)
            ran += 1
            continue
        servers = [c for c in commands(block.text) if is_server(c)]
        if servers:
            sandbox.stop_daemon()      # they take the default endpoint themselves
        else:
            sandbox.ensure_daemon()
        for command in commands(block.text):
            if is_server(command):
                sandbox.stop(sandbox.serve(command, where), f"{where}: `{command}`")
            else:
                sandbox.run(["bash", "-o", "pipefail", "-c", command], f"{where}: `{command}`")
            ran += 1
    assert ran >= 30
    # What the examples left behind is what they promised.
    assert (sandbox.dir / "runs" / "tiny" / "head.pt").is_file()
    assert (sandbox.dir / "request.json").is_file()


def test_requests_md_examples_are_accepted_and_its_worked_example_adds_up(sandbox):
    """docs/REQUESTS.md: its bodies and questions are decided; its worked answer is what the code computes."""
    found = [json.loads(b.text) for b in blocks(REQUESTS, ("json",))]
    bodies = [x for x in found if "state" in x and "questions" in x]
    questions = [x for x in found if "type" in x]
    assert bodies and len(questions) == 3, "the examples of REQUESTS.md were not found"
    sandbox.ensure_daemon()
    with JevClient(sandbox.endpoint, timeout=60) as client:
        for body in bodies + [{"state": {"ticket": "parcel lost"}, "questions": {"q": q}} for q in questions]:
            result = client.decide(body["state"], body["questions"])
            assert set(result["answers"]) == set(body["questions"])
    # The worked example answers the first body's questions; the formulas must give its numbers.
    worked = next(x for x in found if set(x) == set(bodies[0]["questions"]))
    asked = {q.qid: q for q in parse_decision(bodies[0]).questions}
    for qid, answer in worked.items():
        probabilities = list(answer["probabilities"].values())
        assert shape_answer(asked[qid], probabilities) == answer, qid


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of a page: no such file, or no such heading there."""
    out = []
    for line, target in links(path.read_text()):
        if not is_relative(target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path.resolve()
        where = f"{path.relative_to(root)}:{line}: {target}"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif anchor and dest.suffix != ".md":
            out.append(f"{where}: an anchor into a file that is not a page")
        elif anchor and anchor not in {h.anchor for h in headings(dest)}:
            out.append(f"{where}: no heading with that anchor in {dest.relative_to(root)}")
    return out


def test_every_relative_link_points_at_a_file_and_heading_that_exist():
    documents = [README, TESTS_README] + sorted(DOCS.glob("*.md"))
    assert sum(len(links(path.read_text())) for path in documents) > 100, "the links were not found"
    problems = [p for path in documents for p in broken_links(path)]
    assert problems == [], "\n".join(problems)


def test_the_link_check_knows_githubs_anchors_and_sees_a_broken_link(tmp_path):
    assert slug("Across hosts: CurveZMQ") == "across-hosts-curvezmq"
    assert slug("`noul`: a yes/no probability") == "noul-a-yesno-probability"
    assert slug("1. Body fields") == "1-body-fields"
    tmp_path = tmp_path.resolve()
    (tmp_path / "other.md").write_text("# Other\n\n## Its part\n")
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Media\n\n### Media\n\n"
                    "[a](#media-1) [b](#title) [c](other.md#its-part) [d](gone.md) [e](#nope) [f](other.md#gone)\n"
                    "`[g](gone-too.md)` [h](https://example.org/nowhere)\n\n"
                    "```sh\n# not a heading\n[i](gone-three.md)\n```\n")
    assert [h.anchor for h in headings(page)] == ["title", "media", "media-1"]
    assert broken_links(page, tmp_path) == [
        "page.md:7: gone.md: no such file",
        "page.md:7: #nope: no heading with that anchor in page.md",
        "page.md:7: other.md#gone: no heading with that anchor in other.md"]
