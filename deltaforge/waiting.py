"""What ``serve`` is waiting on, said on ``SIGUSR1``: every asyncio task's chain of awaits and
every thread's stack, as one ``waiting_on`` log event, and the process goes on as before.

A pipeline standing still with ``/health`` ok is the hardest fault to see from outside (a
connection that answers nothing and closes nothing, a lock held elsewhere): ``kill -USR1 <pid>``
shows where, without a debugger or a restart, as a JVM's ``jstack`` or a Go program's SIGQUIT
dump does. py-spy sees threads but not what a coroutine awaits: the event loop's thread only
shows ``select``. Each task is named by whoever started it (a supervisor names a child's task
``Supervisor/Child``)."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from types import FrameType
from typing import Any

import structlog

THREAD_FRAMES = 12
"""The innermost frames kept of each thread's stack: the outer ones are the thread's start-up."""


def _where(frame: FrameType) -> str:
    module = frame.f_globals.get("__name__", frame.f_code.co_filename)
    return f"{module}:{frame.f_lineno} {frame.f_code.co_qualname}"


def awaits(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits, outermost first: each coroutine down the chain of its awaits
    (``cr_await``; generator-based and async-generator frames too). A chain that ends awaiting
    another task names it."""
    chain: list[str] = []
    obj: Any = task.get_coro()
    while obj is not None:
        frame = (
            getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None) or getattr(obj, "ag_frame", None)
        )
        if frame is not None:
            chain.append(_where(frame))
        elif isinstance(obj, asyncio.Task):
            chain.append(f"task {obj.get_name()}")
        obj = (
            getattr(obj, "cr_await", None)
            or getattr(obj, "gi_yieldfrom", None)
            or getattr(obj, "ag_await", None)
        )
    return chain


def stacks() -> dict[str, list[str]]:
    """Every thread's stack by its name, outermost first, its innermost :data:`THREAD_FRAMES`."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out: dict[str, list[str]] = {}
    for ident, top in sys._current_frames().items():
        frames: list[str] = []
        frame: FrameType | None = top
        while frame is not None and len(frames) < THREAD_FRAMES:
            frames.append(_where(frame))
            frame = frame.f_back
        out[names.get(ident, str(ident))] = frames[::-1]
    return out


def say() -> None:
    """Log every task's awaits and every thread's stack (in the event loop's thread)."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    structlog.get_logger().info(
        "waiting_on",
        actor="cli",
        tasks=[{"task": t.get_name(), "awaits": awaits(t)} for t in tasks],
        threads=stacks(),
    )


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Say what the process waits on at each ``SIGUSR1`` (:func:`say`)."""
    loop.add_signal_handler(signal.SIGUSR1, say)
