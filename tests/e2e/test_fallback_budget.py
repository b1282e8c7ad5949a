"""FL_FALLBACK_BUDGET on a real run: a CUDA script whose loss is float64 takes 5 host fallback
calls per step on the Ascend profile (15 in 3 steps). Within the budget the run passes; beyond
it, the run fails at exit naming the operators, or at the first violation with ``:strict``."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_python

SCRIPT = str(Path(__file__).resolve().parent / "clients" / "float64_loss.py")
EXCEEDED = 3


def run(budget: str, in_code: bool = False):
    if in_code:
        return run_python([SCRIPT], env={"FL_SIM_PROFILE": "ascend", "FL_FALLBACK_BUDGET": budget,
                                         "INIT_IN_CODE": "1"}, timeout=300)
    return run_python(["-m", "flagos_torchfl", "run", "--profile", "ascend", SCRIPT],
                      env={"FL_FALLBACK_BUDGET": budget}, timeout=300)


@pytest.mark.parametrize("budget", ["15", "100%"])
def test_a_run_within_its_budget_passes(budget):
    done = run(budget)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("DONE") and "budget" not in done.stderr


def test_a_run_over_a_count_fails_at_exit_naming_the_operators():
    done = run("14")
    assert done.returncode == EXCEEDED, done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("DONE")  # the run went to its end
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("flagos_torchfl: fallback budget exceeded (FL_FALLBACK_BUDGET=14): 15 host "
                           "fallback calls, more than the 14 allowed: aten::")
    # operators with equal counts are ordered by their measured time share, which varies with load
    assert "aten::pow.Tensor_Scalar (3 calls" in last and "aten::mean (3 calls" in last


def test_a_run_over_a_share_fails_at_exit():
    done = run("0.01%")
    assert done.returncode == EXCEEDED
    assert "of operator time, more than the 0.01% allowed: aten::" in done.stderr


def test_strict_fails_at_the_first_violation():
    done = run("4:strict")
    assert done.returncode == 1 and "DONE" not in done.stdout and "step 0" not in done.stdout
    assert "FallbackBudgetExceeded: fallback budget exceeded (FL_FALLBACK_BUDGET=4:strict): 5 host fallback calls" \
        in done.stderr
    done = run("0.01%:strict")  # a share is checked at each optimizer step
    assert done.returncode == 1 and "step 0" not in done.stdout
    assert "FallbackBudgetExceeded" in done.stderr and "optimizer" in done.stderr


def test_the_budget_holds_for_a_program_that_activates_itself():
    done = run("1", in_code=True)
    assert done.returncode == EXCEEDED and done.stdout.rstrip().endswith("DONE")
    assert "more than the 1 allowed" in done.stderr
