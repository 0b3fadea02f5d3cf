"""Router calibration from trace replay and measured latencies (WhiFlash's entropy and neural policies, HVD's payoff predictor)."""
