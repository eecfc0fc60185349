"""The ``report.json`` contract and everything that turns figures into it: the schema, step statistics, the
build, atomic files, writing (one place), merging ranks (folder or process-group store) and ``diff``.

Nothing here imports torch; :mod:`~perfhooks.report.write` renders HTML through ``perfhooks.sinks.html``.
"""
