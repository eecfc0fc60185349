"""The run as other threads see it: the published state, the report built from it, its periodic saves, the outputs (W&B
rows, the end table) and the live watch."""
