"""accelerate_train.py after what transformers does at import: ``importlib.util.find_spec`` on each framework
(is it installed?) without importing it, and a submodule imported before its package.

    python accelerate_after_find_spec.py PROJECT_DIR STEPS
"""

import importlib.util
import runpy
from pathlib import Path

if __name__ == "__main__":
    for name in ("accelerate", "lightning", "transformers"):
        assert importlib.util.find_spec(name) is not None, name
    import accelerate.utils  # noqa: F401  (the submodule first: its package is imported on the way)

    runpy.run_path(str(Path(__file__).with_name("accelerate_train.py")), run_name="__main__")
