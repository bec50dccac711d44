"""The code blocks of README.md and docs/*.md run, so the documentation cannot drift.

Every fenced block of a runnable language is one test, its id the page and the line of its
opening fence (``docs/records.md:8``):

- ```python blocks run as a reader's script would: in a fresh interpreter (`docs_child.py`),
  with a fresh temporary directory as the working directory, so whatever a block writes
  (``./data``) lands there and never in the repository.
- ```bash, ```sh, ```shell and ```console blocks run their commands one by one, the same way.
  Only ``s3stream ...`` and ``python -m s3stream ...`` commands may appear (in a console block,
  the lines after a ``$`` prompt; the other lines are output, not checked); one command per
  line, ``\\`` continues a line, ``#`` starts a comment; no pipes, redirections or ``&&``.
- Blocks of other languages, or of none, never run. A block without a language whose lines
  are s3stream commands fails: label it, so that it runs.

A block runs by default and must finish within `TIMEOUT_S`. An HTML comment on the line right
above the opening fence says otherwise (words combine: ``<!-- doc-test: continue, s3 -->``)::

    <!-- doc-test: skip (needs a raw block device) -->

does not run; the reason in parentheses is required and shows in ``pytest -rs``.
``<!-- doc-test: s3 -->`` runs the block against the suite's S3 server (the session fixture
``seaweedfs`` of conftest.py): the block finds an empty bucket named ``bucket`` and the endpoint
and credentials in the environment variables boto3 reads (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), as a deployment
would have them; the test is marked ``s3``. ``<!-- doc-test: spark -->`` runs the block in this
process, where ``SparkSession.builder.getOrCreate()`` returns the session this module keeps
for the run (a JVM per block would cost ~8 s each), with the JVM's working directory as the
block's (emptied before each Spark block), so that a relative path means the same to the
block, to the JVM and to its Python workers; the test is marked ``spark``, so ``-m "not
spark"`` leaves it out. A block importing pyspark without the marker fails (and is marked
``spark`` all the same). ``<!-- doc-test: continue -->`` builds on the page's previous Python
or shell block: both run in one interpreter (one namespace for Python blocks) and one
directory. The test of a continuing block runs the whole chain again from its first block, so
every test passes or fails on its own and ``-k`` can pick any of them; a chain needs what any
of its blocks asks for (``s3``, ``spark``).

Blocks without ``s3`` see no AWS credentials at all (every ``AWS_*`` variable removed, the
config files hidden), so a doc example can never reach a real account. A block that runs may
not name an absolute path (in a string or an argument; comments are free): it would write
outside its directory, and tests run as root in containers. The directory of a block that
passed is removed (a local store preallocates a 256 MiB WAL file). A marker anywhere but right
above a fence, an unknown word, or a skip without a reason fails a test of its own.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("docs_child.py")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Seconds a block (a whole chain) may take; the slowest one starts its own SeaweedFS.
TIMEOUT_S = 60
#: The bucket ``s3`` blocks find, emptied before each of them.
DOC_BUCKET = "bucket"

PYTHON_LANGS = frozenset({"python", "py", "python3"})
SHELL_LANGS = frozenset({"bash", "sh", "shell", "console", "shell-session"})
WORDS = frozenset({"skip", "s3", "spark", "continue"})

_FENCE = re.compile(r"(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)")
_MARKER = re.compile(r"\s*<!--\s*doc-test\s*:(?P<body>.*?)-->\s*")
# A line that starts like a marker (one quoted in running text, `<!-- doc-test: ... -->`, is not).
_ANY_MARKER = re.compile(r"\s*<!--\s*doc-test")
_PYSPARK = re.compile(r"^\s*(from|import)\s+pyspark\b", re.MULTILINE)
_COMMAND = re.compile(r"\s*(\$\s+)?(s3stream|python3? -m s3stream)(\s|$)")
_SHELL_SYNTAX = frozenset({"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>&1", "&>"})
# A path from the root, or a file:// URL (also object+file://) naming one.
_ABSOLUTE = re.compile(r"/[\w.-]|[a-z0-9+.-]*file:///")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page, or a problem found at a line of it (`problem` set)."""

    rel: str  # the page, relative to the repository root
    line: int  # the opening fence's line (1-based), or the line of the problem
    kind: str = ""  # "python" or "shell"
    code: str = ""
    commands: tuple[tuple[str, ...], ...] = ()
    words: frozenset[str] = frozenset()
    reason: str = ""
    problem: str = ""
    parent: Block | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return f"{self.rel}:{self.line}"

    def chain(self) -> list[Block]:
        """The blocks this one builds on (``continue``), first to last, then itself."""
        blocks = [self]
        while blocks[0].parent is not None:
            blocks.insert(0, blocks[0].parent)
        return blocks

    def needs(self, word: str) -> bool:
        return any(word in b.words for b in self.chain())

    def step(self) -> dict[str, Any]:
        """What `docs_child.py` runs for this block."""
        if self.kind == "python":
            path = str(ROOT / self.rel)
            return {"kind": "python", "path": path, "line": self.line + 1, "code": self.code}
        return {"kind": "shell", "path": self.rel, "line": self.line, "commands": self.commands}

    def param(self) -> Any:
        marks: list[Any] = []
        if "skip" in self.words:
            marks.append(pytest.mark.skip(reason=f"{self.id}: {self.reason}"))
        for word in ("s3", "spark"):
            if self.needs(word):
                marks.append(getattr(pytest.mark, word))
        if self.needs("spark"):
            marks.append(pytest.mark.timeout(TIMEOUT_S))  # in this process: pytest-timeout's
        return pytest.param(self, id=self.id, marks=marks)


def parse_marker(body: str) -> tuple[frozenset[str], str, str]:
    """The words, the reason and a problem (or "") of a marker's text after ``doc-test:``."""
    words_text, paren, rest = body.partition("(")
    reason = ""
    if paren:
        rest = rest.strip()
        if not rest.endswith(")"):
            return frozenset(), "", f"unclosed reason in doc-test marker {body.strip()!r}"
        reason = rest[:-1].strip()
    words = frozenset(w for w in re.split(r"[\s,]+", words_text.strip()) if w)
    if not words:
        return words, reason, "empty doc-test marker"
    if words - WORDS:
        unknown = ", ".join(sorted(words - WORDS))
        return words, reason, f"unknown doc-test word(s) {unknown} (known: {sorted(WORDS)})"
    if "skip" in words and not reason:
        return words, reason, "doc-test: skip needs its reason: <!-- doc-test: skip (why) -->"
    if "skip" in words and len(words) > 1:
        return words, reason, "doc-test: skip takes no other word"
    return words, reason, ""


def shell_commands(code: str, *, console: bool) -> tuple[tuple[str, ...], ...]:
    """The commands of a shell block as argv tuples; ValueError says why one cannot run."""
    commands: list[tuple[str, ...]] = []
    pending = ""
    for raw in code.splitlines():
        line = raw
        if console and not pending:
            stripped = line.lstrip()
            if not stripped.startswith("$"):
                continue  # output shown after a command
            line = stripped[1:]
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if _SHELL_SYNTAX & set(argv):
            raise ValueError(
                f"shell syntax (pipes, redirections, ;, &&) is not run: {line.strip()!r}; "
                "write one command per line"
            )
        if argv[0] != "s3stream" and argv[:3] not in (
            ["python", "-m", "s3stream"],
            ["python3", "-m", "s3stream"],
        ):
            raise ValueError(
                f"only s3stream commands run here, not {line.strip()!r}: if the block is not "
                "meant to run, mark it <!-- doc-test: skip (why) -->"
            )
        commands.append(tuple(argv))
    if pending:
        raise ValueError("the block ends inside a continued line (a trailing \\)")
    return tuple(commands)


def absolute_paths(kind: str, code: str, commands: tuple[tuple[str, ...], ...]) -> list[str]:
    """The absolute paths a block names (in its string literals or arguments, not comments)."""
    values: list[str] = []
    if kind == "python":
        # A block that does not tokenize fails when it runs; f-strings are not checked.
        with contextlib.suppress(tokenize.TokenError, SyntaxError):
            for token in tokenize.generate_tokens(io.StringIO(code).readline):
                if token.type == tokenize.STRING:
                    with contextlib.suppress(ValueError, SyntaxError):
                        values.append(ast.literal_eval(token.string))
    else:
        values = [part for argv in commands for arg in argv for part in arg.split("=")]
    return [v for v in values if isinstance(v, str) and _ABSOLUTE.match(v)]


def parse_page(text: str, rel: str) -> list[Block]:
    """The blocks of one page that run (or say why not), and its marker problems."""
    lines = text.splitlines()
    blocks: list[Block] = []
    marker_lines: set[int] = set()  # 0-based lines of markers that sit right above a fence
    fenced: set[int] = set()  # 0-based lines inside code blocks (a marker there is code)
    previous: Block | None = None  # the page's last Python or shell block, for ``continue``
    i = 0
    while i < len(lines):
        m = _FENCE.fullmatch(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        end = i + 1
        while end < len(lines):
            closing = lines[end].strip()
            if set(closing) == {fence[0]} and len(closing) >= len(fence):
                break
            end += 1
        code = "\n".join(_dedent(ln, indent) for ln in lines[i + 1 : end]) + "\n"
        fenced.update(range(i + 1, end))
        info = m["info"].split()
        lang = info[0].lower() if info else ""
        line = i + 1
        words: frozenset[str] = frozenset()
        reason = problem = ""
        marker = _MARKER.fullmatch(lines[i - 1]) if i > 0 else None
        if marker is not None:
            marker_lines.add(i - 1)
            words, reason, problem = parse_marker(marker["body"])
        i = end + 1
        if lang not in PYTHON_LANGS | SHELL_LANGS:
            if marker is not None and not problem:
                problem = f"a doc-test marker above a block that never runs (```{lang})"
            elif "skip" not in words and any(_COMMAND.match(ln) for ln in code.splitlines()):
                problem = (
                    "a block without a language holds s3stream commands: label it ```bash or "
                    "```console so that it runs (or mark it skip, with the reason)"
                )
            if problem:
                blocks.append(Block(rel, line, problem=problem))
            continue
        kind = "python" if lang in PYTHON_LANGS else "shell"
        commands: tuple[tuple[str, ...], ...] = ()
        if kind == "shell" and not problem and "skip" not in words:
            try:
                commands = shell_commands(code, console=lang in ("console", "shell-session"))
            except ValueError as exc:
                problem = str(exc)
        if not problem and "skip" not in words and (paths := absolute_paths(kind, code, commands)):
            # Blocks run as this user (root, in CI containers): a path outside the block's
            # directory would be written for real, or the repository changed.
            problem = (
                f"{paths[0]!r} is an absolute path: a block runs in a temporary directory and "
                "writes only below it; use a relative path (./data), or mark it skip (why)"
            )
        parent = None
        if "continue" in words and not problem:
            if previous is None:
                problem = "doc-test: continue, but no Python or shell block above on this page"
            elif "skip" in previous.words or previous.problem:
                problem = f"doc-test: continue, but {previous.id} above does not run"
            else:
                parent = previous
        if (
            kind == "python"
            and "skip" not in words
            and _PYSPARK.search(code)
            and not ("spark" in words or (parent is not None and parent.needs("spark")))
        ):
            problem = problem or (
                "the block uses Spark: mark it <!-- doc-test: spark --> (it then gets the "
                "run's session instead of starting a JVM of its own)"
            )
            words |= {"spark"}  # so that -m "not spark" leaves it out all the same
        block = Block(rel, line, kind, code, commands, words, reason, problem, parent)
        blocks.append(block)
        previous = block
    for n, text_line in enumerate(lines):
        if _ANY_MARKER.match(text_line) and n not in marker_lines | fenced:
            blocks.append(
                Block(
                    rel,
                    n + 1,
                    problem="a doc-test marker must be alone on the line right above the fence "
                    "of the block it is about",
                )
            )
    return sorted(blocks, key=lambda b: b.line)


def _dedent(line: str, indent: int) -> str:
    """`line` without up to `indent` leading spaces (a fence indented in a list)."""
    stripped = line[:indent].lstrip(" ")
    return stripped + line[indent:]


def collect() -> list[Block]:
    return [
        b for page in PAGES for b in parse_page(page.read_text(), page.relative_to(ROOT).as_posix())
    ]


BLOCKS = collect()


# ==============================================================================================
# Running blocks


def _load_child() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_child", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def block_env(s3: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a block: no AWS credentials of this machine, `s3`'s if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    env.update(s3 or {})
    return env


def run_child(
    steps: list[dict[str, Any]], cwd: Path, env: dict[str, str], timeout_s: float = TIMEOUT_S
) -> tuple[int, str]:
    """Run `steps` in a fresh interpreter; its exit code (-1: timed out) and output."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills what it started too
    )
    try:
        out, _ = proc.communicate(json.dumps(steps), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # The leader is not reaped yet, so the group id still names only what it started.
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, f"{out}\n(killed: still running after {timeout_s} s)"
    return proc.returncode, out


def _s3_vars(server: Any) -> dict[str, str]:
    """The variables through which boto3 finds the suite's S3 server, as a deployment's would."""
    return {
        "AWS_ENDPOINT_URL": server.endpoint_url,
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _empty_doc_bucket(server: Any) -> None:
    from s3stream.objectstore.s3 import S3ObjectStore

    server.make_bucket(DOC_BUCKET)  # no error if it exists (SeaweedFS and moto alike)
    store = S3ObjectStore(DOC_BUCKET, **server.storage_options())
    try:
        store.delete_many([info.key for info in store.list()])
    finally:
        store.close()


@dataclass(frozen=True)
class DocSpark:
    session: Any
    #: The JVM's working directory, so also the blocks': relative paths mean the same in the
    #: block, in the JVM and in its Python workers (children of the JVM).
    workdir: Path


@pytest.fixture(scope="session")
def doc_spark(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DocSpark]:
    """A local SparkSession for the run, which the blocks' ``getOrCreate()`` returns."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("Spark needs Java 17")
    from pyspark.sql import SparkSession

    workdir = tmp_path_factory.mktemp("spark-blocks")
    launch_env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # Spark finds pyspark_s3stream (auto-registration) by listing sys.path, which misses
        # an editable install's import hook: the repository on the path stands in for a wheel.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if any(b.needs("spark") and b.needs("s3") for b in BLOCKS):
        # The source runs in Python workers, children of the JVM: they see the environment the
        # JVM started with, never a block's (spark.executorEnv does not reach the planner).
        launch_env.update(_s3_vars(request.getfixturevalue("seaweedfs")))
    with pytest.MonkeyPatch.context() as mp:
        # Only while the JVM starts: it keeps both, the rest of the run does not.
        mp.chdir(workdir)
        for key, value in launch_env.items():
            mp.setenv(key, value)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("s3stream-doc-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    jvm_dir = session._jvm.java.lang.System.getProperty("user.dir")
    if Path(jvm_dir).resolve() != workdir.resolve():
        # getOrCreate returned a session started elsewhere (tests/test_spark.py's, when it ran
        # first), which is not ours to stop: relative paths would land in its directory.
        pytest.skip(f"a Spark session started in {jvm_dir} runs already")
    try:
        yield DocSpark(session, workdir)
    finally:
        session.stop()


def run_block(
    block: Block, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run `block` (its whole chain) as the module docstring says; fail the test if it fails."""
    if block.problem:
        pytest.fail(f"{block.id}: {block.problem}", pytrace=False)
    s3 = None
    if block.needs("s3"):
        server = request.getfixturevalue("seaweedfs")
        _empty_doc_bucket(server)
        s3 = _s3_vars(server)
    env = block_env(s3)
    steps = [b.step() for b in block.chain()]
    if block.needs("spark"):
        workdir = request.getfixturevalue("doc_spark").workdir
        for entry in workdir.iterdir():  # what the previous Spark block left
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        for key in os.environ:
            if key not in env:
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(workdir)
        _load_child().run_steps(steps, {"__name__": "__main__"})
        return
    code, out = run_child(steps, tmp_path, env)
    print(out)
    if code != 0:
        pytest.fail(f"{block.id} failed (exit code {code}):\n{out}", pytrace=False)
    # Kept only to debug a failure: a local store preallocates its WAL file (256 MiB, 2 GiB
    # for a bare path), and pytest keeps the directories of three runs.
    shutil.rmtree(tmp_path)


@pytest.mark.parametrize("block", [b.param() for b in BLOCKS])
def test_doc_block(
    block: Block, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_block(block, request, tmp_path, monkeypatch)


# ==============================================================================================
# The runner itself


def test_every_page_has_blocks_that_run() -> None:
    pages = {b.rel for b in BLOCKS if not b.problem and "skip" not in b.words}
    # A collector that finds nothing would pass everything.
    assert "README.md" in pages and "docs/records.md" in pages, pages


def test_markers() -> None:
    page = [
        "<!-- doc-test: skip (needs a block device) -->",  # 1
        "```python",
        "open('/dev/nvme1n1')",
        "```",
        "```python",  # 5
        "x = 1",
        "```",
        "<!-- doc-test: continue, s3 -->",
        "```python",  # 9
        "assert x == 1",
        "```",
        "<!-- doc-test: skip -->",
        "```python",  # 13
        "```",
        "<!-- doc-test: s4 -->",
        "```python",  # 16
        "```",
        "<!-- doc-test: s3 -->",  # 18: not right above the fence
        "",
        "```python",  # 20
        "```",
        "<!-- doc-test: s3 -->",
        "```toml",  # 23
        "```",
        "<!-- doc-test: continue -->",
        "```bash",  # 26
        "s3stream inspect ./data",
        "```",
    ]
    blocks = parse_page("\n".join(page), "p.md")
    skip, first, cont, no_reason, unknown, loose, plain, toml, after_toml = blocks
    assert [b.line for b in blocks] == [2, 5, 9, 13, 16, 18, 20, 23, 26]
    assert (skip.words, skip.reason, skip.problem) == ({"skip"}, "needs a block device", "")
    assert not first.words and not first.problem and not first.needs("s3")
    assert cont.parent is first and cont.chain() == [first, cont] and cont.needs("s3")
    assert cont.id == "p.md:9" and cont.step()["line"] == 10
    assert "needs its reason" in no_reason.problem
    assert "unknown doc-test word(s) s4" in unknown.problem
    assert "right above the fence" in loose.problem
    assert not plain.problem and not plain.words
    assert "never runs (```toml)" in toml.problem
    # Blocks that never run are passed over: a shell block continues the Python block above.
    assert after_toml.parent is plain and not after_toml.problem
    assert after_toml.step()["commands"] == (("s3stream", "inspect", "./data"),)


def test_spark_blocks_must_say_so() -> None:
    page = (
        "```python\nfrom pyspark.sql import SparkSession\n```\n"
        "<!-- doc-test: spark -->\n```python\nimport pyspark\n```\n"
        "<!-- doc-test: continue -->\n```python\nfrom pyspark.sql import functions\n```\n"
    )
    unmarked, marked, cont = parse_page(page, "p.md")
    assert "mark it <!-- doc-test: spark -->" in unmarked.problem and unmarked.needs("spark")
    assert not marked.problem and not cont.problem and cont.needs("spark")


def test_continue_needs_a_block_that_runs() -> None:
    page = "<!-- doc-test: skip (no) -->\n```python\n```\n<!-- doc-test: continue -->\n```py\n```\n"
    _, cont = parse_page(page, "p.md")
    assert cont.parent is None and "p.md:2 above does not run" in cont.problem
    (orphan,) = parse_page("<!-- doc-test: continue -->\n```python\n```\n", "p.md")
    assert "no Python or shell block above" in orphan.problem


def test_absolute_paths_are_refused() -> None:
    page = (
        "```python\n"
        "open('/mnt/ebs/wal', 'wb')  # '/etc' in a comment is fine\n"
        "```\n"
        "```python\n"
        "s3stream.open('./data', wal='object+file:///var/wal')\n"
        "```\n"
        "```python\n"
        "'/'.join(['s3://bucket', 'a'])\n"
        "```\n"
        "```console\n"
        "$ s3stream take-over ./data n1 --wal=file:///mnt/n1.wal\n"
        "```\n"
    )
    mnt, var, fine, shell = parse_page(page, "p.md")
    assert "'/mnt/ebs/wal' is an absolute path" in mnt.problem
    assert "'object+file:///var/wal' is an absolute path" in var.problem
    assert not fine.problem
    assert "'file:///mnt/n1.wal' is an absolute path" in shell.problem


def test_unlabelled_commands_and_indented_fences() -> None:
    page = (
        "```\npython -m s3stream inspect ./data\n```\n"
        "- item\n\n  ```python\n  y = 2\n  ```\n"
        "````markdown\n<!-- doc-test: skip (shown, not a marker) -->\n```python\n```\n````\n"
    )
    unlabelled, indented = parse_page(page, "p.md")
    assert "without a language holds s3stream commands" in unlabelled.problem
    assert indented.code == "y = 2\n" and not indented.problem


def test_shell_commands() -> None:
    console = (
        "$ s3stream inspect ./data   # streams\n"
        "stream 0 ...\n"
        "$ python -m s3stream \\\n"
        "  verify ./data\n"
        "ok\n"
    )
    assert shell_commands(console, console=True) == (
        ("s3stream", "inspect", "./data"),
        ("python", "-m", "s3stream", "verify", "./data"),
    )
    with pytest.raises(ValueError, match="only s3stream commands"):
        shell_commands("make demo\n", console=False)
    with pytest.raises(ValueError, match="shell syntax"):
        shell_commands("s3stream dump ./data 0 | head\n", console=False)


def test_a_chain_runs_in_one_directory(tmp_path: Path) -> None:
    page = (
        "```python\nimport s3stream\n\nwith s3stream.open('./data') as client:\n"
        "    client.create_stream(tags={'topic': 'orders'})\n```\n"
        "<!-- doc-test: continue -->\n```console\n$ s3stream inspect ./data\nstream 0 ...\n```\n"
    )
    _, inspect = parse_page(page, "p.md")
    code, out = run_child([b.step() for b in inspect.chain()], tmp_path, block_env())
    assert code == 0, out
    assert "$ s3stream inspect ./data" in out and "orders" in out


@pytest.mark.spark
@pytest.mark.timeout(TIMEOUT_S)
def test_a_spark_block_writes_below_its_directory(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = (
        "<!-- doc-test: spark -->\n```python\nfrom pyspark.sql import SparkSession\n\n"
        "SparkSession.builder.getOrCreate().range(3).write.parquet('out')\n```\n"
    )
    (block,) = parse_page(page, "p.md")
    run_block(block, request, tmp_path, monkeypatch)
    # Spark resolves 'out' in the JVM's directory, which is the block's (not the repository).
    assert (request.getfixturevalue("doc_spark").workdir / "out" / "_SUCCESS").exists()
    assert not (ROOT / "out").exists()


def test_a_failing_block_fails(tmp_path: Path) -> None:
    page = "```python\nimport s3stream\n\nassert s3stream.open is None\n```\n"
    (block,) = parse_page(page, "p.md")
    code, out = run_child([block.step()], tmp_path, block_env())
    assert code == 1
    assert 'p.md", line 4' in out and "AssertionError" in out
    shell = Block("p.md", 7, "shell", commands=(("s3stream", "no-such-command"),))
    code, out = run_child([shell.step()], tmp_path, block_env())
    assert code == 1 and "p.md:7: `s3stream no-such-command` exited with 2" in out


def test_a_block_that_hangs_is_killed(tmp_path: Path) -> None:
    page = "```python\nimport subprocess\n\nsubprocess.run(['sleep', '60'])\n```\n"
    (block,) = parse_page(page, "p.md")
    code, out = run_child([block.step()], tmp_path, block_env(), timeout_s=1)
    assert code == -1 and "killed: still running after 1 s" in out
