"""Fixtures the runner's tests share."""

import pytest

from runner_modules import load_runner


@pytest.fixture(scope="module")
def runner():
    """A fresh runner per test module, loaded the way the zygote loads it."""
    return load_runner()
