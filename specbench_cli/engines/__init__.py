"""The engines behind `specbench run --engine`: the same prompts, records and report for each.

`specbench.py` is our decode loop's job (core/, one job for every batch size); `vllm.py` drives a vLLM engine in
its own Python (with `vllm_worker.py` on the engine's side, `vllm_server.py` over HTTP, `vllm_methods.py` the
method mapping, and `vllm_routed.py` the routed methods' proposers inside vLLM); `options.py` what each takes on
the command line. Which engine runs is looked up in `registry.ENGINES`, never decided by an `if`. Engines read a
run's plan and write its records through `run_folder.record`; only the commands import them.
"""
