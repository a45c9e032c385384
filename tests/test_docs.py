"""The runnable examples in docstrings run, and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest
import structlog

from deltaforge import logsetup

MODULES = [
    "actors.actor",
    "actors.message",
    "actors.threads",
    "supervision.supervisor",
    "deltaforge.configmodel",
    "deltaforge.position",
    "deltaforge.logrepeats",
    "deltaforge.connectfail",
    "deltaforge.configaddrs",
    "deltaforge.sources.kafka.position",
    "deltaforge.sources.mysql.connection",
    "deltaforge.sources.mysql.statements",
    "deltaforge.sources.mysql.cascades",
    "deltaforge.sources.mysql.binlog",
    "deltaforge.snapshot.window",
    "deltaforge.sinks.durability",
    "deltaforge.sinks.acknowledged",
    "deltaforge.sinks.base",
    "deltaforge.sinks.kafka_settings",
    "deltaforge.api.listen",
    "deltaforge.pipeline.runlock",
    "deltaforge.pipeline.rereading",
    "deltaforge.pipeline.runningtimer",
    "deltaforge.sinks.redis_memory",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    structlog.reset_defaults()  # as in a user's fresh interpreter: log lines on stdout, shown
    try:
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    finally:
        logsetup.configure("info")  # what conftest sets for every test
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
