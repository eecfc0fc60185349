"""Where reports go: the console and local files (W&B and HTML arrive as their own modules)."""
