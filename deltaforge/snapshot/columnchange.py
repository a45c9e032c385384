"""What a DDL did to rows already delivered, without a change event for any of them, and what is
done about it: said (``columns_changed``), and with ``snapshot.on_column_change: snapshot`` the
table read again, so sinks take the rows as they are now."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaforge.snapshot.chunks import SnapshotRefused
from deltaforge.sources.base import ColumnsRewritten
from supervision import Unavailable

if TYPE_CHECKING:
    from deltaforge.snapshot.driver import SnapshotDriver


class ColumnChanges:
    """The column changes of one pipeline's source; the SourceReader hands them over."""

    def __init__(self, driver: SnapshotDriver) -> None:
        self.driver = driver

    async def changed(self, table: str, was: list[dict[str, Any]], now: list[dict[str, Any]]) -> None:
        """``table`` gained a column, or one changed type (``was`` → ``now``). The DDL may have
        changed rows already delivered: a default filling the new column (one that leaves them
        NULL changed nothing, and is not counted), a conversion."""
        types = {c["name"]: c for c in was}
        added = [c["name"] for c in now if c["name"] not in types]
        retyped = [c["name"] for c in now if c["name"] in types and retyped_column(types[c["name"]], c)]
        if added:  # a column existing rows hold NULL in changed none of them
            try:
                added = await self.driver.source.filled(table, added)
            except Unavailable:
                raise  # down: asked again after the reconnect (see SourceReader._record_schema)
            except Exception as exc:  # noqa: BLE001 - cannot tell: taken as filled, said below
                self.driver.log.info(
                    "column_defaults_unknown", table=table, reason=f"{type(exc).__name__}: {exc}"
                )
        if added or retyped:
            await self._said(
                table,
                added,
                retyped,
                "a DDL that fills or converts a column changes rows without a change event",
            )

    async def rewritten(self, fact: ColumnsRewritten) -> None:
        """A DDL the source found changed ``fact.columns`` in existing rows (no schema change tells)."""
        await self._said(fact.table, [], list(fact.columns), fact.why)

    async def _said(self, table: str, added: list[str], retyped: list[str], why: str) -> None:
        driver = self.driver
        again = driver.settings.on_column_change == "snapshot" and driver.reader is not None
        driver.log.warning(
            "columns_changed", table=table, added=added, retyped=retyped,
            action="snapshot" if again else "none",
            reason=f"{why}; rows delivered before keep their old values until they change"
            + ("" if again else f" (snapshot the table again: deltaforge snapshot {driver.ctx.config.name} {table})"),
        )  # fmt: skip
        if again:
            try:
                await driver.request([table], "column_change")
            except SnapshotRefused as exc:  # e.g. a table without a primary key: said, not fatal
                driver.log.error("snapshot_after_column_change_refused", table=table, error=str(exc))


def retyped_column(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a column's type changed so that rows may have been converted: its type, its
    length, precision or scale where the source reports one (PostgreSQL's ``mod``; a schema
    recorded before it was reported has none), or an ENUM or SET that lost a member (renamed or
    dropped: the rows that held it hold another value now; one added changes no row)."""
    if was["type"] != now["type"] or ("mod" in was and "mod" in now and was["mod"] != now["mod"]):
        return True
    return "members" in was and "members" in now and not set(was["members"]) <= set(now["members"])
