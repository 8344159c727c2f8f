"""What runs for a step, whatever the backend: its argv and its clean environment."""

from __future__ import annotations

import os
from collections.abc import Mapping

from sandbox_core import defaults as d
from sandbox_core.models import ExecStep, PythonStep

# Python runs the step's script with cwd importable, as `python -c` would, but isolated (-I).
PYTHON_BOOTSTRAP = (
    "import sys; sys.path.insert(0, ''); p = sys.argv.pop(1); sys.argv[0] = p;"
    " exec(compile(open(p, encoding='utf-8').read(), '<step>', 'exec'),"
    " {'__name__': '__main__', '__builtins__': __builtins__})"
)
# The same with the source itself as the argument (for sources small enough for argv).
PYTHON_INLINE_BOOTSTRAP = (
    "import sys; sys.path.insert(0, ''); s = sys.argv.pop(1); sys.argv[0] = '-c';"
    " exec(compile(s, '<step>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})"
)
BASH = ("bash", "--noprofile", "--norc")
# Below Linux's 128 KiB limit on one exec argument.
INLINE_SOURCE_BYTES = 64 * 1024


def source_of(step: ExecStep) -> str:
    return step.code if isinstance(step, PythonStep) else step.command


def script_argv(step: ExecStep, python: str, script: str) -> list[str]:
    """Run the step's source from the file ``script`` (as the sandbox sees it)."""
    if isinstance(step, PythonStep):
        return [python, "-I", "-c", PYTHON_BOOTSTRAP, script]
    return [*BASH, script]


def inline_argv(step: ExecStep, python: str) -> list[str] | None:
    """Run the step's source given on the command line, or None when it is too long."""
    source = source_of(step)
    if len(source.encode()) > INLINE_SOURCE_BYTES:
        return None
    if isinstance(step, PythonStep):
        return [python, "-I", "-c", PYTHON_INLINE_BOOTSTRAP, source]
    return [*BASH, "-c", source]


def clean_environment(
    home: str, tmp: str, job_env: Mapping[str, str], from_host: tuple[str, ...] = d.ENV_ALLOWLIST
) -> dict[str, str]:
    """The host's variables named in ``from_host``, the sandbox's own paths, then the
    job's env. (A container gets none of the host's: its image may lack the host locale.)"""
    env = {name: os.environ[name] for name in from_host if name in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        PATH=d.SANDBOX_PATH,
        HOME=home,
        TMPDIR=tmp,
        PWD=home,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(job_env)
    return env
