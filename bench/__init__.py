"""Side-by-side benchmarks of vessel-workers against hand-rolled baselines (bench/README.md)."""
