"""``python -m perfhooks ...`` (and ``torchrun -m perfhooks run SCRIPT``): the command line."""

import sys

_package = sys.modules.get("perfhooks")
if getattr(_package, "__file__", None) is None:
    # A folder named perfhooks (no __init__.py) in the current folder was imported as a namespace package in place
    # of an editable install's: its modules still load, the package's own names do not.
    _folder = next(iter(getattr(_package, "__path__", None) or []), "./perfhooks")
    sys.stderr.write(f"perfhooks: the folder {_folder} hides the installed package from `import perfhooks` "
                     "(an older version's report folder, or --output-dir perfhooks): rename or remove it, or run the "
                     "`perfhooks` command, which it does not hide\n")
    raise SystemExit(2)

from perfhooks.cli import main  # noqa: E402

raise SystemExit(main())
