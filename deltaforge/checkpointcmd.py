"""``deltaforge checkpoints``: list checkpoints and their versions, roll one back, forget sinks'."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

from deltaforge.pipeline.owner import owner_key
from deltaforge.pipeline.runlock import RunLock
from deltaforge.redact import redact
from deltaforge.state.checkpoints import CheckpointStore, open_store, set_back_key, set_back_note


async def _held_by_us(store: CheckpointStore, args: argparse.Namespace, locks: list[RunLock]) -> str | None:
    """For ``--forget`` and ``--rollback``: the run lock of each pipeline whose checkpoints they
    change, taken into ``locks`` (so that none starts meanwhile); why not, if one is running. A
    change under a running pipeline would be overwritten by its next checkpoint write."""
    if args.storage_type == "memory":
        return None
    keys = args.forget or [args.rollback]
    for source in dict.fromkeys(k.split("::", 1)[0] for k in keys):
        owner = await store.get(owner_key(source))
        if owner is None or not isinstance(name := owner.get("name"), str):
            continue
        lock = RunLock(args.storage_path, name)
        if not lock.acquire():
            return (
                f"pipeline {name!r} is running ({lock.holder()}): stop it first; its next checkpoint "
                "write would undo the change"
            )
        locks.append(lock)
    return None


async def _note_set_back(store: CheckpointStore, keys: list[str], how: str) -> None:
    """Sinks' checkpoints set back by hand are noted, for the sinks to set back their own records
    of what they hold at the next start (an exactly-once sink skips a replay by them)."""
    notes = {set_back_key(*k.split("::sink::", 1)): set_back_note(how) for k in keys if "::sink::" in k}
    if notes:
        await store.put_many(notes)


async def _checkpoints(args: argparse.Namespace) -> int:
    store = open_store(args.storage_type, args.storage_path)
    await store.open()
    locks: list[RunLock] = []
    try:
        if (args.forget or args.rollback) and (running := await _held_by_us(store, args, locks)):
            print(running, file=sys.stderr)
            return 1
        if args.forget:
            held = await store.get_many(args.forget)
            if missing := [k for k in args.forget if k not in held]:
                print(
                    f"no checkpoint {', '.join(missing)} (deltaforge checkpoints lists them)", file=sys.stderr
                )
                return 1
            await store.delete_keys(args.forget)
            await _note_set_back(store, args.forget, "forget")
            print(f"forgot {', '.join(args.forget)}: at the next start each is a sink added, given a snapshot "
                  "under snapshot.mode initial or when_needed")  # fmt: skip
            return 0
        if args.rollback:
            await store.rollback(args.rollback, args.to)
            await _note_set_back(store, [args.rollback], "rollback")
            print(f"rolled back {args.rollback} to version {args.to}")
            return 0
        if args.versions:
            for v in await store.versions(args.versions):
                when = datetime.fromtimestamp(v.created_at, UTC).isoformat(timespec="seconds")
                print(f"{v.version:>6}  {when}  {v.value}")
            return 0
        listed = await store.list_all()
        if not listed:
            print("no checkpoints")
        for key, (version, updated, value) in listed.items():
            when = datetime.fromtimestamp(updated, UTC).isoformat(timespec="seconds")
            print(f"{key}  v{version}  {when}  {value}")
        return 0
    except KeyError as exc:
        print(redact(str(exc.args[0])), file=sys.stderr)
        return 1
    finally:
        await store.close()
        for lock in locks:
            lock.release()


def cmd_checkpoints(args: argparse.Namespace) -> int:
    if args.forget and (odd := [k for k in args.forget if "::sink::" not in k]):
        print(
            f"--forget takes sinks' checkpoint keys (<source>::sink::<sink>), got {', '.join(odd)}",
            file=sys.stderr,
        )
        return 2
    if args.rollback and args.to is None:
        print("--rollback KEY needs --to VERSION", file=sys.stderr)
        return 2
    if args.storage_type != "memory" and not Path(args.storage_path).exists():
        # Opened, a store that is not there is made (its folders too): a mistyped path was told
        # "no checkpoints", and a --forget or --rollback there "no checkpoint", of an empty store.
        print(
            f"no checkpoint store at {args.storage_path}: give the pipeline's spec.storage.path with "
            "--storage-path",
            file=sys.stderr,
        )
        return 1
    return asyncio.run(_checkpoints(args))
