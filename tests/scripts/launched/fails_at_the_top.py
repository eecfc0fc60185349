raise RuntimeError("failed at the top")
