"""Snapshots: the rows already in the tables, copied in chunks while changes keep streaming.

DBLog's watermark algorithm (Netflix, 2019; Debezium's incremental snapshots): each chunk
of a table, one primary-key range, is selected between a *low* and a *high* watermark
written into the change stream itself. Changes read between the two watermarks for a key
of the chunk are newer than (or as new as) the selected row, so that row is dropped from
the chunk; what is left is emitted at the high watermark, as ``op: r`` events ordered
just after it. No table lock, no long transaction, and streaming never stops.

* ``window.py`` — one watermark window and the chunks read in it;
* ``progress.py`` — what a snapshot has done, saved beside the checkpoints;
* ``driver.py`` — runs snapshots inside the SourceReader's reads;
* ``terminal.py`` — the progress bar ``serve`` draws on a terminal.
"""
