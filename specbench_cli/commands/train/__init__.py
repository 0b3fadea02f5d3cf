"""Self-distillation: the corpus the target answers, one training recipe per drafter format, and the training loop."""
