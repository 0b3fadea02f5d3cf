"""`specbench tune`: the draft budget that maximises tokens/s on this machine. command.py checks a tune's input
and picks its kind; budget.py tunes one budget (replay per candidate, c(n), live check); batch.py one per batch
size; vllm.py one draft length per concurrency in vLLM; pricing.py is the model they share (costs, predictions,
the tune record)."""
