"""The examples of PyTorch's CUDA-graphs documentation (``tests/fixtures/pytorch_docs``, its text
unmodified: the first example of "PyTorch API", whole-network capture of a training step with
dropout, partial capture with ``make_graphed_callables`` and data-dependent control flow), run as
they stand by ``clients/graph_doc_examples.py`` under ``python -m flagos_torchfl run`` on cpu, sim
and the ascend profile. Each gives its eager twin's parameters, losses and outputs bit for bit,
random numbers included (a capture draws none; each replay draws where eager would), and prints
what the documentation says it prints."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from tests.e2e.realclients import client, records, run_launched

DOCUMENT = Path(__file__).resolve().parents[1] / "fixtures" / "pytorch_docs" / "cuda_graphs.rst"
BACKENDS = {"cpu": ["--backend", "cpu"], "sim": ["--backend", "sim"], "ascend": ["--profile", "ascend"]}
TITLES = ["PyTorch API", "Whole-network capture", "Partial-network capture"]
pytestmark = [pytest.mark.full, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def results():
    def launch(where):
        return run_launched([*where, client("graph_doc_examples.py"), str(DOCUMENT)], timeout=900)

    with concurrent.futures.ThreadPoolExecutor(len(BACKENDS)) as pool:
        procs = dict(zip(BACKENDS, pool.map(launch, BACKENDS.values())))
    return {name: {r["title"]: r for r in records(proc, "example")} for name, proc in procs.items()}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("title", TITLES)
def test_a_documentation_example_computes_what_its_eager_twin_computes(results, backend, title):
    record = results[backend][title]
    assert record["tensors"] >= 2
    assert record["difference"] == 0.0, record
    assert record["printed"] == record["eager_printed"]
    expected_type = {"cpu": "cpu", "sim": "sim", "ascend": "npu"}[backend]
    assert record["device"].split(":")[0] == expected_type


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_first_example_prints_what_the_documentation_says(results, backend):
    printed = results[backend]["PyTorch API"]["printed"].splitlines()
    assert len(printed) == 2
    assert "[6., 6., 6., 6., 6.]" in printed[0] and "[8., 8., 8., 8., 8.]" in printed[1]
