"""The runnable examples in docstrings run, and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "actors.actor",
    "actors.message",
    "supervision.supervisor",
    "deltaforge.configmodel",
    "deltaforge.position",
    "deltaforge.sources.kafka.position",
    "deltaforge.sources.mysql.connection",
    "deltaforge.api.listen",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
