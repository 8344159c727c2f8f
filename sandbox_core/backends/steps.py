"""What runs for a step, whatever the backend: its argv and its clean environment."""

from __future__ import annotations

import os
import string
from collections.abc import Mapping

from sandbox_core import defaults as d
from sandbox_core.models import ExecStep, PythonStep

# Python runs the step's script with cwd importable, as `python -c` would, but isolated
# (-I), its stdout line-buffered (as on a terminal: a step killed at its timeout keeps its
# lines; -I ignores PYTHONUNBUFFERED, and -u would lose output: a raw pipe write cut
# short by a signal handler is dropped, CPython issue 85393; many short lines cost ~4x
# block buffering either way, RESULTS.md). The code runs in the real ``__main__``
# module, whose namespace the bootstrap leaves as it found it (plus ``__file__`` for a
# script): unittest.main(), doctest.testmod(), pickle and multiprocessing look their
# names up there (run in a dict of its own, a failing test suite ran no test and passed:
# an attack review). The script is read under `with` (an unclosed file's ResourceWarning
# would leave ``__warningregistry__`` in the namespace).
# exec() of the text, not of compile(): the builtin compile() builds the `ast` node
# classes on its first call (~0.5 ms of every step's interpreter start, here); exec()
# parses and compiles the text in C. Tracebacks name the file "<string>", as `-c` would.
_PYTHON_START = "import sys; sys.stdout.reconfigure(line_buffering=True); sys.path.insert(0, '');"
PYTHON_BOOTSTRAP = (
    _PYTHON_START + " sys.argv.pop(0); __file__ = sys.argv[0]; del sys\n"
    "with open(__file__, encoding='utf-8') as f: s = f.read()\n"
    "del f; exec(globals().pop('s'))"
)
# The same with the source itself as the argument (for sources small enough for argv):
# as `python -c`, no ``__file__``.
PYTHON_INLINE_BOOTSTRAP = _PYTHON_START + " del sys; exec(__import__('sys').argv.pop(1))"
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


# Outside quotes, only characters bash takes literally (no expansion, redirection,
# operator, glob, comment, brace or tilde); inside double quotes, none of $ ` \.
_PLAIN = frozenset(string.ascii_letters + string.digits + "_./:,+@%=-")
_IN_DOUBLE_QUOTES_NOT = frozenset("$`\\")
# bash's reserved words and builtins: a command named so is bash's own, not a program.
_BASH_OWN_WORDS = """
    ! [[ ]] { } case do done elif else esac fi for function if in select then time until
    while . : [ alias bg bind break builtin caller cd command compgen complete compopt
    continue declare dirs disown echo enable eval exec exit export false fc fg getopts hash
    help history jobs kill let local logout mapfile popd printf pushd pwd read readarray
    readonly return set shift shopt source suspend test times trap true type typeset ulimit
    umask unalias unset wait coproc
"""
_BASH_OWN = frozenset(_BASH_OWN_WORDS.split())
# Variables bash acts on at start (a startup file, options, what PATH search skips).
_BASH_STARTUP_ENV = frozenset({"ENV", "SHELLOPTS", "EXECIGNORE", "POSIXLY_CORRECT"})


def direct_words(command: str, env: Mapping[str, str]) -> list[str] | None:
    """The words of ``command`` when bash would run it as one program with these words
    and nothing else (no expansion, no operator, no builtin, no startup file), else None.
    Such a command may skip bash (~1.7 ms per step here): the exec helper runs the words
    and, should that exec fail, the bash script after all (sandfarm-exec --direct).
    What the job sees differ only in bash's own SHLVL and _ variables."""
    if any(name.startswith("BASH") or name in _BASH_STARTUP_ENV for name in env):
        return None
    if any(entry.startswith("~") for entry in env.get("PATH", "").split(":")):
        return None  # bash expands a leading ~ in PATH entries; execve would not
    if len(command.encode()) > INLINE_SOURCE_BYTES:
        return None  # its words go on the helper's command line (128 KiB per word)
    # One pass checks the grammar and splits the words as bash (and shlex) would: quotes
    # removed, quoted and plain parts of a word joined, '' an empty word.
    words: list[str] = []
    part: list[str] = []
    in_word = False
    quote = ""
    for char in command:
        if quote == "'":
            if char == "'":
                quote = ""
            else:
                part.append(char)
        elif quote == '"':
            if char in _IN_DOUBLE_QUOTES_NOT:
                return None
            if char == '"':
                quote = ""
            else:
                part.append(char)
        elif char in "'\"":
            quote, in_word = char, True
        elif char in " \t":
            if in_word:
                words.append("".join(part))
                part, in_word = [], False
        elif char in _PLAIN:
            part.append(char)
            in_word = True
        else:
            return None
    if quote:
        return None  # unterminated: bash's error to give
    if in_word:
        words.append("".join(part))
    if not words or words[0] in _BASH_OWN or "=" in words[0] or words[0].startswith("%"):
        return None  # empty, bash's own, an assignment, a job spec
    return words


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
    # the working directory, whatever the job's env says, as bash sets it (a simple
    # command is exec'd without bash: sandfarm-exec --direct)
    env["PWD"] = home
    return env
