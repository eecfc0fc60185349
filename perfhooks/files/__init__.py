"""Small shared pieces for files: atomic writes (:mod:`~perfhooks.files.atomic`) and the one background thread
that does file work off the training thread (:mod:`~perfhooks.files.writer`)."""
