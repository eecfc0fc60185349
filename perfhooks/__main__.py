"""``python -m perfhooks ...`` (and ``torchrun -m perfhooks run SCRIPT``): the command line."""

from perfhooks.cli import main

raise SystemExit(main())
