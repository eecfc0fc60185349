"""Several ranks of one job: which rank this is (:mod:`~perfhooks.distributed.ranks`), the process group's
key-value store (:mod:`~perfhooks.distributed.store`), the rank summaries gathered at the close and the ranks'
traces merged (:mod:`~perfhooks.distributed.gather`), and one on-demand trigger for every rank
(:mod:`~perfhooks.distributed.all_ranks`). Never a collective: every wait is bounded, and the store traffic of a
wait round does not grow with the ranks."""
