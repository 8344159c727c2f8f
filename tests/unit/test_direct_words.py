"""Which command steps may skip bash (sandbox_core.backends.steps.direct_words): only a
command bash would run as one program with exactly these words. Anything bash would
expand, redirect, chain or run itself keeps bash."""

from __future__ import annotations

import pytest

from sandbox_core.backends.steps import direct_words


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("/bin/true", ["/bin/true"]),
        ('python3 -c "print(1)"', ["python3", "-c", "print(1)"]),
        ("python3 -c 'import os; print($HOME)'", ["python3", "-c", "import os; print($HOME)"]),
        ("gcc -O2 -o a a.c", ["gcc", "-O2", "-o", "a", "a.c"]),
        ("pytest -q --maxfail=1 tests/", ["pytest", "-q", "--maxfail=1", "tests/"]),
        ("cmd a\"b c\"d ''", ["cmd", "ab cd", ""]),
    ],
)
def test_simple_commands_go_direct(command: str, words: list[str]) -> None:
    assert direct_words(command, {}) == words


@pytest.mark.parametrize(
    "command",
    [
        "true",  # builtins and keywords are bash's own
        "echo hi",
        "exec python3",
        "if",
        "FOO=1 cmd",  # an assignment
        "%1",  # a job spec
        'python3 -c "print($HOME)"',  # expansion inside double quotes
        "echo `id`",
        "ls *.py",  # glob
        "ls ~",  # tilde
        "echo {a,b}",  # braces
        "a; b",  # operators and redirections
        "a && b",
        "a | b",
        "a > f",
        "a < f",
        "a &",
        "(a)",
        "a # comment",
        "a\\ b",  # backslash
        "a\nb",  # two commands
        "a 'open",  # unterminated quote: bash's error
        "",
        "   ",
        "caf\u00e9",  # non-ASCII outside quotes
    ],
)
def test_anything_bash_would_interpret_keeps_bash(command: str) -> None:
    assert direct_words(command, {}) is None


@pytest.mark.parametrize("name", ["BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "EXECIGNORE"])
def test_bash_startup_variables_keep_bash(name: str) -> None:
    assert direct_words("/bin/true", {name: "x"}) is None
    assert direct_words("/bin/true", {"OTHER": "x"}) == ["/bin/true"]


def test_every_bash_builtin_and_keyword_keeps_bash() -> None:
    """The list matches what this host's bash calls its own (compgen -b, -k)."""
    import shutil
    import subprocess

    from sandbox_core.backends.steps import _BASH_OWN

    bash = shutil.which("bash")
    assert bash is not None
    own = subprocess.run(
        [bash, "--noprofile", "--norc", "-c", "compgen -b; compgen -k"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(own) > 50  # the listing ran
    assert set(own) <= _BASH_OWN, sorted(set(own) - _BASH_OWN)
    for word in own:
        assert direct_words(f"{word} x", {}) is None, word


def test_tilde_in_path_and_long_commands_keep_bash() -> None:
    assert direct_words("foo", {"PATH": "~/bin:/usr/bin"}) is None  # bash expands it
    assert direct_words("foo", {"PATH": "/usr/bin"}) == ["foo"]
    long_word = "A" * 200_000  # past Linux's 128 KiB per exec argument
    assert direct_words(f"/bin/echo {long_word}", {}) is None


def test_its_split_is_shlexs_on_every_command_it_accepts() -> None:
    """direct_words splits in the pass that checks the grammar; shlex (posix), which the
    grammar was written against, must agree on every command it accepts."""
    import random
    import shlex

    alphabet = "ab1._/:=%@- \t'\"$\\x"
    rng = random.Random(7)
    accepted = 0
    for _ in range(20000):
        command = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        words = direct_words(command, {"PATH": "/usr/bin"})
        if words is not None:
            accepted += 1
            assert words == shlex.split(command, posix=True), command
    assert accepted > 1000  # the comparison ran on many accepted commands
