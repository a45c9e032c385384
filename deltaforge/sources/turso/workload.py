"""A small built-in workload that writes to the embedded Turso database.

It exists so that ``python -m deltaforge serve`` shows changes flowing within
seconds with no database of your own. It runs inside the service's process
because pyturso locks the file per process. Turn it off with
``serve --no-workload`` or ``workload: {enabled: false}`` in the source config.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS orders ("
    "id INTEGER PRIMARY KEY, customer TEXT, amount REAL, status TEXT, version INTEGER, note BLOB)"
)
STATUSES = ("new", "paid", "shipped", "delivered")


class DemoWorkload:
    """Inserts, updates and deletes ``orders`` rows at a steady rate in a thread.

    Every update bumps ``version`` so per-row order is visible in the output.
    """

    def __init__(
        self, path: str, rows_per_second: float = 20.0, max_rows: int = 0, seed: int | None = None
    ) -> None:
        self.path = path
        self.rate = rows_per_second
        self.max_rows = max_rows
        self.rng = random.Random(seed)
        self.written = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="deltaforge-demo-workload", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        import turso

        try:
            conn = turso.connect(self.path)
            conn.execute("PRAGMA unstable_capture_data_changes_conn('full')")
            conn.execute(TABLE_DDL)
            conn.commit()
            live = [r[0] for r in conn.execute("SELECT id FROM orders").fetchall()]
            interval = 1.0 / self.rate if self.rate > 0 else 0.0
            next_at = time.monotonic()
            while not self._stop.is_set():
                if self.max_rows and self.written >= self.max_rows:
                    break
                self._one_transaction(conn, live)
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    next_at = time.monotonic()
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the source, not lost in a thread
            self.error = exc

    def _one_transaction(self, conn: Any, live: list[int]) -> None:
        roll = self.rng.random()
        if not live or roll < 0.5:
            n = 1 if self.rng.random() < 0.8 else self.rng.randint(2, 4)
            for _ in range(n):
                cur = conn.execute(
                    "INSERT INTO orders (customer, amount, status, version, note) VALUES (?, ?, 'new', 1, ?)",
                    (f"customer-{self.rng.randint(1, 50)}", round(self.rng.uniform(5, 500), 2), b"\x00df"),
                )
                live.append(int(cur.lastrowid))
                self.written += 1
        elif roll < 0.9:
            oid = self.rng.choice(live)
            conn.execute(
                "UPDATE orders SET status = ?, version = version + 1 WHERE id = ?",
                (self.rng.choice(STATUSES), oid),
            )
            self.written += 1
        else:
            oid = live.pop(self.rng.randrange(len(live)))
            conn.execute("DELETE FROM orders WHERE id = ?", (oid,))
            self.written += 1
        conn.commit()
