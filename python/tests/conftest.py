"""pytest options: --allocator native|cachalot (see _setup.py)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

import _setup  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--allocator", default=os.environ.get(_setup.ENV, "native"),
                     choices=["native", "cachalot"], help="the allocator under test")


def pytest_configure(config):
    _setup.setup(config.getoption("--allocator"))


def pytest_report_header(config):
    import torch

    return f"{_setup.describe()} (torch {torch.__version__}, backend {torch.cuda.memory.get_allocator_backend()})"


@pytest.fixture
def cachalot():
    """True when the allocator under test is cachalot."""
    return _setup.is_cachalot()


@pytest.fixture(autouse=True)
def _clean_device():
    import torch

    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


_REPORTS = []


def pytest_runtest_logreport(report):
    # one line per test (the call phase, or the phase that failed or skipped)
    if report.when == "call" or report.outcome != "passed":
        _REPORTS.append({"test": report.nodeid.split("/")[-1], "status": report.outcome,
                         "seconds": report.duration,
                         "message": str(report.longrepr)[-2000:] if report.outcome == "failed" else ""})


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("CACHALOT_TEST_JSON")
    if path:
        import json

        Path(path).write_text(json.dumps(_REPORTS, indent=1))
