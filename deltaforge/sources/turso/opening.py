"""Opening a Turso database for reading: the file itself, and the checkpoint still in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltaforge.sources.base import PositionLost, SourceError, SourceMisconfigured, SourceUnavailable
from deltaforge.sources.turso.position import TursoPosition


def connect(path: str, who: str) -> Any:
    """A connection to the database at ``path`` (its folder made). pyturso locks a file per
    process: a file another process holds (the application writing it, run in a process of its
    own) is unavailable, waited for as a server that is down is, since it may be stopped. A path
    naming a folder is misconfigured: no wait or restart makes it a database file."""
    import turso

    if Path(path).is_dir():
        raise SourceMisconfigured(f"{who}: {path} is a folder; path names the database file")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        return turso.connect(path)
    except Exception as exc:
        if "locked by another process" in str(exc):
            raise SourceUnavailable(
                f"{who}: {path} is locked by another process (the application writing it? pyturso lets "
                "one process at a time open a database file): waiting for it to let go; run the writer "
                "inside deltaforge, or stop it while deltaforge reads"
            ) from None
        raise SourceError(f"{who}: cannot open {path}: {exc}") from exc


def check_position(conn: Any, path: str, resume: TursoPosition, where: str) -> None:
    """Halt rather than skip: the checkpointed change must still be in ``turso_cdc``, and be the
    same change (a pruned table or a replaced file would otherwise jump a gap). ``where`` names
    the checkpoint in the messages."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'turso_cdc'"
    ).fetchall()
    first = last = row = None
    if has_table:
        first, last = conn.execute("SELECT min(change_id), max(change_id) FROM turso_cdc").fetchone()
        row = conn.execute(
            "SELECT change_txn_id, change_time FROM turso_cdc WHERE change_id = ?", (resume.change_id,)
        ).fetchone()
    conn.commit()
    if last is None or int(last) < resume.change_id:
        held = "no turso_cdc table" if not has_table else f"turso_cdc ends at change_id {last}"
        raise PositionLost(
            f"{where} is not in {path} ({held}; the database was replaced or its CDC table truncated)"
        )
    if row is None:
        raise PositionLost(
            f"{where} is no longer in {path} (turso_cdc holds change_id {first}..{last}: the changes "
            "after the checkpoint were pruned)"
        )
    if resume.txn is not None and (int(row[0]), int(row[1])) != (resume.txn, resume.at):
        raise PositionLost(
            f"{where} is another change in {path} than the one checkpointed (transaction {row[0]} at "
            f"{row[1]}, not {resume.txn} at {resume.at}): the database file was replaced"
        )
