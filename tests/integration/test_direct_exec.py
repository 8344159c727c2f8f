"""A command step that is one simple command skips bash (sandfarm-exec --direct): the
exec helper runs its words itself and, if that exec fails, the step's bash script after
all. Each test first shows which path ran (bash exports SHLVL; a direct exec does not),
then that the job saw exactly what it sees through bash: the same confinement, the same
words, and bash's own message and exit status for every failure."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from sandbox_core import Backend, JobResult, get_backend, parse_spec
from sandbox_core.backends.steps import direct_words
from tests.conftest import require

# What confines a process, as the kernel reports it for the job's own process.
STATUS = (
    "import os; s = dict(line.split(':', 1) for line in open('/proc/self/status'));"
    " keys = ('Uid', 'Gid', 'Groups', 'NoNewPrivs', 'Seccomp', 'CapEff', 'CapBnd');"
    " print(*[s[k].strip() for k in keys], sep='|');"
    " print(sorted(os.listdir('/proc/self/fd')),"
    " open('/proc/self/cgroup').read().count('sandfarm'));"
    " print(os.environ.get('SHLVL'))"
)


@pytest.fixture(params=["process", "bwrap"])
def local(request: pytest.FixtureRequest, is_root: bool) -> Iterator[Backend]:
    require(is_root, "the exec helper's confinement needs root (slot uids, cgroups)")
    if request.param == "bwrap":
        require(shutil.which("bwrap") is not None, "bubblewrap is not installed")
    backend = get_backend(request.param)
    require(backend.exec_helper is not None, "no exec helper built (make setup)")  # type: ignore[attr-defined]
    yield backend
    backend.close()


def run(backend: Backend, command: str, **spec: object) -> JobResult:
    return backend.run(parse_spec({"command": command, **spec}))


def test_simple_command_runs_without_bash_and_as_confined(local: Backend) -> None:
    direct = run(local, f'python3 -c "{STATUS}"')
    through_bash = run(local, f'python3 -c "{STATUS}"; true')  # an operator: bash runs it
    assert direct.status.value == "succeeded", direct
    assert through_bash.status.value == "succeeded", through_bash
    *seen_direct, shlvl_direct = direct.steps[0].stdout.splitlines()
    *seen_bash, shlvl_bash = through_bash.steps[0].stdout.splitlines()
    assert shlvl_bash == "1" and shlvl_direct == "None"  # each took its own path
    assert seen_direct == seen_bash  # same uid, no_new_privs, seccomp, caps, fds, cgroup
    uid, _, _, nnp, seccomp, cap_eff, _ = seen_direct[0].split("|")
    assert not uid.startswith("0") and nnp == "1" and seccomp == "2" and int(cap_eff, 16) == 0


def test_words_reach_the_program_as_bash_would_split_them(local: Backend) -> None:
    command = "python3 -c 'import sys; print(sys.argv[1:])' a \"b c\" '' d'e f'g"
    result = run(local, command)
    assert result.steps[0].stdout == "['a', 'b c', '', 'de fg']\n", result
    assert direct_words(command, {}) is not None  # the direct path


@pytest.mark.parametrize(
    ("command", "code", "message"),
    [
        ("no-such-program --flag", 127, "no-such-program: command not found"),
        ("./plain.txt", 126, "./plain.txt: Permission denied"),
    ],
)
def test_a_failed_exec_falls_back_to_bash_and_its_words(
    local: Backend, command: str, code: int, message: str
) -> None:
    result = run(local, command, files={"plain.txt": "just text\n"})
    assert direct_words(command, {}) is not None  # the direct path was tried first
    step = result.steps[0]
    assert step.exit_code == code, result
    assert message in step.stderr  # bash's own words, from the script's line 1
    assert "line 1" in step.stderr


def test_a_script_without_shebang_runs_as_bash_would_run_it(local: Backend) -> None:
    spec = {
        "steps": [{"kind": "bash", "command": c} for c in ("chmod +x job.sh", "./job.sh")],
        "files": {"job.sh": "echo run by $0\n"},
    }
    result = local.run(parse_spec(spec))
    assert direct_words("./job.sh", {}) is not None  # tried directly: ENOEXEC, then bash
    assert result.status.value == "succeeded", result
    assert result.steps[-1].stdout == "run by ./job.sh\n"


def test_bash_startup_variables_keep_bash(local: Backend) -> None:
    files = {"startup.sh": "echo startup file read\n"}
    result = run(local, "/bin/echo job", env={"BASH_ENV": "startup.sh"}, files=files)
    assert direct_words("/bin/echo job", {}) is not None  # would go direct without it
    assert result.steps[0].stdout == "startup file read\njob\n", result  # bash ran it


def test_the_program_bash_would_pick_is_the_only_one_tried(local: Backend) -> None:
    """A PATH candidate whose exec fails (its #! interpreter is missing) is bash's to
    report: the direct path must not go on to a later PATH entry and run that."""
    spec = {
        "files": {"b1/tool": "#!/nonexistent\n", "b2/tool": "#!/bin/sh\necho SECOND\n"},
        "env": {"PATH": "b1:b2:/usr/bin:/bin"},
        "steps": [
            {"kind": "bash", "command": c} for c in ("chmod +x b1/tool b2/tool", "b2/tool", "tool")
        ],
    }
    result = local.run(parse_spec(spec))
    assert direct_words("tool", spec["env"]) is not None  # the direct path
    assert result.steps[1].stdout == "SECOND\n", result  # the later one would run
    step = result.steps[2]
    assert "SECOND" not in step.stdout
    assert step.exit_code == 127, result
    assert "b1/tool" in step.stderr  # bash's own report of the first candidate
