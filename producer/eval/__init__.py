"""Evaluation runs: benchmark samples through the farm, verdicts a solution cannot fake, pass@k."""
