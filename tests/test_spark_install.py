"""The Spark quickstart of docs/spark.md, run the way a newcomer runs it.

Each test makes a fresh virtual environment outside the repository, installs s3stream into it
with pip (a normal install, then an editable one), and runs the quickstart block of
``docs/spark.md`` with that environment's Python, from a directory outside the repository,
with ``PYSPARK_PYTHON`` unset and the environment not activated (its ``bin`` is not on PATH).
Then, in the same process, it checks which Python and which s3stream Spark's tasks ran, that
loading a missing directory is an error naming it that creates nothing, and that Spark did
not log that the source replaced a statically registered one.

Why this is faithful although nothing is downloaded: s3stream itself is built and installed
for real, by pip, with the project's build backend and pyproject configuration (the wheel's
file list, the editable install's mechanism, ``pyspark_s3stream`` beside ``s3stream`` — what
decides whether Spark finds the source). Only its dependencies are borrowed: a ``.pth`` file
puts the project's ``.venv`` site-packages on the new environment's ``sys.path``, after its
own site-packages. A ``.pth`` line is how site-packages reach ``sys.path`` in the first place,
so imports and Spark's ``pkgutil.iter_modules()`` scan see them as they would see the same
packages installed there, and they are the versions pyproject allows (the ``.venv`` resolved
them from it). ``.pth`` files inside that borrowed directory are not run (only those of a
site directory are), so the project's own editable s3stream stays invisible: the driver and
the tasks must use the copy installed here, and the test checks that they do. The source is
copied first so that pip builds outside the working tree (an in-tree build writes ``build/``
and ``*.egg-info`` there, under other engineers' feet). ``--no-build-isolation`` uses the
build backend from the ``.venv`` (pyproject's ``dev`` extra) instead of downloading it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

REPO = Path(__file__).resolve().parents[1]
#: What pip needs to build and install s3stream: the package sources and the metadata.
SOURCES = ("pyproject.toml", "README.md", "s3stream", "pyspark_s3stream")
REPLACED = "replaced a statically registered data source"

# Run after the quickstart, in its process and session.
CHECKS = """

# ---- tests/test_spark_install.py
import json as _json
import os as _os
import sys as _sys


def _where(_):
    import sys

    import s3stream

    return [sys.executable, s3stream.__file__]


_missing = _os.path.abspath("no-such-store")
try:
    spark.read.format("s3stream").load(_missing).collect()
    _error = None
except Exception as exc:
    _error = str(exc)
print("CHECKS " + _json.dumps({
    "driver": [_sys.executable, s3stream.__file__],
    "task": spark.sparkContext.parallelize([0], 1).map(_where).collect()[0],
    "pyspark_python": _os.environ.get("PYSPARK_PYTHON"),
    "missing_error": _error,
    "missing_exists": _os.path.lexists(_missing),
}))
spark.stop()
"""


def _quickstart() -> tuple[str, str]:
    """The quickstart's code and the output it shows, from docs/spark.md."""
    text = (REPO / "docs" / "spark.md").read_text()
    section = text[text.index("## Quickstart") :]
    match = re.search(r"```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", section, re.S)
    assert match, "docs/spark.md: the Quickstart needs a python block, then 'prints' and a block"
    return match.group(1), match.group(2)


def _deps_site_packages() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parents[1]


def _install(root: Path, *, editable: bool) -> Path:
    """A fresh venv under `root` with s3stream installed by pip; returns its Python."""
    src = root / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "_s3stream_test_deps.pth").write_text(f"{_deps_site_packages()}\n")
    backend = int(metadata.version("setuptools").split(".")[0])
    assert backend >= 77, "building s3stream here needs the dev extra: pip install -e '.[dev]'"
    # pip runs under the new venv's Python, which sees the .venv's s3stream through the .pth
    # file: --ignore-installed installs beside it instead of trying to uninstall it.
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run(
        [
            *pip,
            *("--no-deps", "--no-build-isolation", "--ignore-installed", "--no-cache-dir"),
            *(["-e", str(src)] if editable else [str(src)]),
        ],
        cwd=root,
        check=True,
    )
    return python


def _newcomer_env() -> dict[str, str]:
    """This process's environment without what would pick the Python for Spark, and without
    any virtual environment on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PYSPARK_PYTHON",
            "PYSPARK_DRIVER_PYTHON",
            "PYTHONPATH",
            "PYTHONHOME",
            "PYSPARK_GATEWAY_PORT",
            "PYSPARK_GATEWAY_SECRET",
            "SPARK_HOME",
            "VIRTUAL_ENV",
        )
    }
    env["PATH"] = os.pathsep.join(
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d).parent / "pyvenv.cfg").exists()
    )
    # The suite's Spark conventions, without writing them into the documented code.
    env["PYSPARK_SUBMIT_ARGS"] = (
        "--master local[2] --conf spark.ui.enabled=false "
        "--conf spark.sql.session.timeZone=UTC pyspark-shell"
    )
    return env


@pytest.mark.spark
@pytest.mark.parametrize("editable", [False, True], ids=["installed", "editable"])
def test_docs_quickstart_runs_in_a_fresh_venv_outside_the_repo(
    tmp_path: Path, editable: bool
) -> None:
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("Spark needs Java 17")
    assert REPO not in tmp_path.resolve().parents, "the run must be outside the repository"
    python = _install(tmp_path / "env", editable=editable)
    code, shown = _quickstart()
    work = tmp_path / "work"
    work.mkdir()
    (work / "quickstart.py").write_text(code + CHECKS)
    env = _newcomer_env()
    proc = subprocess.run(
        [python, "quickstart.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert shown in proc.stdout
    checks = json.loads(proc.stdout.split("CHECKS ", 1)[1].splitlines()[0])

    # s3stream came from this install, in the driver and in Spark's tasks, and the tasks ran
    # the venv's Python although nothing named it but s3stream.spark.
    installed = (tmp_path / "env" / ("src" if editable else "venv")).resolve()
    assert checks["pyspark_python"] == str(python)
    for executable, module in (checks["driver"], checks["task"]):
        assert executable == str(python)
        assert installed in Path(module).resolve().parents, module

    missing = str(work / "no-such-store")
    assert checks["missing_error"] is not None and missing in checks["missing_error"]
    assert not checks["missing_exists"]
    assert REPLACED not in proc.stderr


def test_spark_etl_example_leaves_an_existing_directory_alone(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("not the example's")
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "spark_etl.py"), "--dir", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert f"{target} exists" in proc.stderr
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "not the example's"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "this"),
        ({"PYSPARK_PYTHON": "/opt/cluster/python3"}, "/opt/cluster/python3"),
        # A driver that spark-submit started: the launcher chose the Python already.
        ({"PYSPARK_GATEWAY_PORT": "40000"}, None),
    ],
    ids=["unset", "set", "spark-submit"],
)
def test_importing_s3stream_spark_names_this_python_only_when_nothing_else_does(
    given: dict[str, str], expected: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")} | given
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, s3stream.spark; print(os.environ.get('PYSPARK_PYTHON'))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert proc.stdout.strip() == str(sys.executable if expected == "this" else expected)
