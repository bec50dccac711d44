"""Child process of tests/test_docs.py: run one chain of documentation code blocks.

Reads a JSON list of steps on stdin, each ``{"kind": "python" | "shell", "path": ..., "line":
..., "code": ...}`` (``"commands"``, a list of argv lists, instead of ``"code"`` for shell
steps), and runs them in order in the current directory. Python steps share one ``__main__``
module, as the blocks of a page would in one script; shell steps run ``s3stream`` (the console
script beside this interpreter) and ``python`` (this interpreter). Any failure exits non-zero
with a traceback or message naming the Markdown file and line.

Only the standard library is imported here, so a block sees a fresh interpreter as a reader's
script would. `run_steps` is also used in-process, for Spark blocks that need the suite's
session.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import Any


def run_python(step: dict[str, Any], namespace: dict[str, Any]) -> None:
    # Padding to the block's first line makes tracebacks name the Markdown line (and show it).
    source = "\n" * (step["line"] - 1) + step["code"]
    exec(compile(source, step["path"], "exec"), namespace)


def resolve(argv: list[str]) -> list[str]:
    """The command line to run for a documented ``s3stream ...`` / ``python ...`` command."""
    if argv[0] == "s3stream":
        script = Path(sys.executable).parent / "s3stream"
        head = [str(script)] if script.is_file() else [sys.executable, "-m", "s3stream"]
        return head + argv[1:]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    raise ValueError(f"not an s3stream command: {shlex.join(argv)}")


def run_shell(step: dict[str, Any]) -> None:
    for argv in step["commands"]:
        print(f"$ {shlex.join(argv)}", flush=True)
        code = subprocess.call(resolve(argv))
        if code != 0:
            raise SystemExit(
                f"{step['path']}:{step['line']}: `{shlex.join(argv)}` exited with {code}"
            )


def run_steps(steps: list[dict[str, Any]], namespace: dict[str, Any]) -> None:
    for step in steps:
        if step["kind"] == "python":
            run_python(step, namespace)
        else:
            run_shell(step)


def main() -> None:
    steps = json.load(sys.stdin)
    # A real __main__ module, so that classes a block defines pickle (Spark, multiprocessing).
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    run_steps(steps, module.__dict__)


if __name__ == "__main__":
    main()
