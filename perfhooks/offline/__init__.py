"""After the run, from files: ``perfhooks analyze`` (:mod:`~perfhooks.offline.analyze`: every analyzer over a
trace, the rules, and a report document) and ``perfhooks diff`` (:mod:`~perfhooks.offline.diff`). No torch."""
