"""How a run ends: the close, the exit guard, signals, and runs left open."""
