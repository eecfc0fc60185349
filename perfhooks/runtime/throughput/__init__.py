"""FLOPs and the matmul dtype: the counted step, its arming, compiled regions' FLOPs, and the precision the run's
matmuls ran in."""
